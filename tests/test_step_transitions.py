"""Step-to-step transitions (``memscope.analysis.step_transitions``): classified on step rows
in the report's format, and on real megatron-core runs: a clean run has no leak flag, Adam's
state is one-time growth, a planted leak is flagged within three steps with its size."""

from __future__ import annotations

from math import prod
from typing import Any

import pytest
from conftest import load_json, read_jsonl, run_in_process

from memscope.analysis.step_transitions import (
    EXPANDABLE_SEGMENTS,
    StepTransitionAnalyzer,
    TransitionKind,
    classify,
    measure,
)

MiB = 1 << 20


def _row(step: int, allocated: int, reserved: int, **extra: Any) -> dict[str, Any]:
    return {"step": step, "allocated_start": allocated, "allocated_end": allocated,
            "reserved_end": reserved, **extra}  # fmt: skip


def _kinds(rows: list[dict[str, Any]]) -> list[str]:
    section = StepTransitionAnalyzer().sections({"steps": rows})["step_transitions"]
    by_step = {t["step"]: t["kind"] for t in section["transitions"]}
    return [by_step.get(r["step"], "steady") for r in rows]


def test_reserved_growing_under_flat_allocated_is_cache_growth_not_a_leak():
    rows = [_row(s, 100 * MiB, (120 + 8 * s) * MiB) for s in range(6)]  # fragmentation
    assert _kinds(rows) == ["steady"] + ["cache_growth"] * 5
    (t,) = measure(rows[:2])[1:]
    (labelled,) = classify([t], [100 * MiB])
    assert EXPANDABLE_SEGMENTS in labelled.cause


def test_allocated_growing_in_three_consecutive_steps_is_a_leak_candidate():
    sizes = [100, 100, 101, 102, 103, 103, 104]  # MiB: a leak of 1 MiB/step, one pause
    rows = [_row(s, n * MiB, 200 * MiB) for s, n in enumerate(sizes)]
    assert _kinds(rows) == ["steady", "steady", *["leak_candidate"] * 3, "steady",
                            "one_time_growth"]  # fmt: skip
    section = StepTransitionAnalyzer().sections({"steps": rows})["step_transitions"]
    assert section["leaks"] == [{"first_step": 2, "last_step": 4, "steps": 3,
                                 "bytes_added": 3 * MiB, "bytes_per_step": MiB,
                                 "rate_basis": "median of the recurring growth of steps 2–4 "
                                 "(3 steps)", "suspects": []}]  # fmt: skip  # no ledger
    assert section["counts"]["leak_candidate"] == 3


def test_moves_within_the_tolerance_are_steady_and_a_drop_is_a_release():
    noise = [100 * MiB + d for d in (0, 4096, 0, 8192, 4096, 0)]  # < 0.01% of 100 MiB
    rows = [_row(s, n, 200 * MiB) for s, n in enumerate(noise)]
    assert set(_kinds(rows)) == {"steady"}
    rows.append(_row(6, 90 * MiB, 200 * MiB))
    assert _kinds(rows)[-1] == "release"


def test_growth_outside_pytorch_is_one_time_growth_with_its_cause():
    rows = [_row(s, 100 * MiB, 200 * MiB, device_end={"device_used_bytes": u * MiB})
            for s, u in enumerate([700, 700, 1200, 1200])]  # fmt: skip
    section = StepTransitionAnalyzer().sections({"steps": rows})["step_transitions"]
    (t,) = section["transitions"]
    assert (t["step"], t["kind"], t["outside_pytorch_delta"]) == (2, "one_time_growth", 500 * MiB)
    assert "outside PyTorch" in t["cause"]


@pytest.mark.integration
def test_a_clean_run_has_no_leak_flag_and_adams_state_is_one_time_growth(tmp_path, small_cfg):
    result = run_in_process(small_cfg, 20, ["--memscope", "--memscope-outdir", str(tmp_path)])
    section = load_json(result.report_path)["step_transitions"]
    assert section["leaks"] == [] and section["counts"]["leak_candidate"] == 0
    survivors = [e for e in read_jsonl(str(tmp_path / "rank00000" / "trace.jsonl"))
                 if e.get("survivors")]  # fmt: skip
    assert survivors == []  # nothing born after the first step outlives its step
    assert section["counts"]["steady"] == 19
    (first,) = section["transitions"]
    assert first["step"] == 0 and first["kind"] == TransitionKind.ONE_TIME_GROWTH.value
    assert first["category_deltas"]["optimizer_state"] == result.optimizer_state_bytes
    assert first["cause"].startswith("optimizer_state:")


@pytest.mark.integration
def test_a_planted_leak_is_flagged_within_three_steps_with_its_size(tmp_path, small_cfg):
    argv = ["--memscope", "--memscope-outdir", str(tmp_path)]
    result = run_in_process(small_cfg, 6, argv, leak_from_step=2)
    report = load_json(result.report_path)
    section = report["step_transitions"]
    leaked = small_cfg.seq_length * small_cfg.micro_batch_size * small_cfg.hidden_size * 4
    # steps 2 to 5 each keep one MLP output; flagged at step 4, the third growing step
    (leak,) = section["leaks"]
    assert {k: leak[k] for k in ("first_step", "last_step", "steps", "bytes_added",
                                 "bytes_per_step")} == {
        "first_step": 2, "last_step": 5, "steps": 4, "bytes_added": 4 * leaked,
        "bytes_per_step": leaked,
    }  # fmt: skip
    # the suspect is the MLP's output, from the module that created it, one per step
    (suspect,) = leak["suspects"]
    assert suspect["module"] == "decoder.layers.0.mlp.linear_fc2"
    assert (suspect["phase"], suspect["microbatch"]) == ("forward", 0)
    assert suspect["birth_steps"] == [2, 3, 4] and suspect["bytes_per_step"] == leaked
    assert "stack" not in suspect and "line" not in suspect  # stacks: only when asked
    text = (tmp_path / "rank00000" / "runtime_report.md").read_text()
    assert "suspect `decoder.layers.0.mlp.linear_fc2` (forward, microbatch 0)" in text
    kinds = {t["step"]: t for t in section["transitions"]}
    assert all(kinds[s]["category_deltas"] == {"activations": leaked} for s in (2, 3, 4, 5))
    assert "activations grew most" in kinds[2]["cause"]


@pytest.mark.integration
def test_deep_mode_names_the_python_frames_that_created_a_leak_suspect(tmp_path, small_cfg):
    history = ["--memscope-enable-memory-snapshot", "--memscope-snapshot-steps", "6"]
    argv = ["--memscope", "--memscope-outdir", str(tmp_path), *history]
    argv += ["--memscope-snapshot-stacks", "python"]
    result = run_in_process(small_cfg, 6, argv, leak_from_step=2)
    (leak,) = load_json(result.report_path)["step_transitions"]["leaks"]
    (suspect,) = leak["suspects"]
    stack = suspect["stack"]
    assert suspect["line"] == stack[0]  # the creating code line
    # innermost first: megatron-core's row-parallel linear made the tensor, called from its
    # MLP's forward; torch's and MemScope's own frames are left out
    assert "megatron/core/tensor_parallel/layers.py" in stack[0]
    assert any("megatron/core/transformer/mlp.py" in f and " in forward" in f for f in stack)
    assert not any("/torch/" in f or "/memscope/capture/" in f for f in stack)
    text = (tmp_path / "rank00000" / "runtime_report.md").read_text()
    assert f"    - at `{stack[0]}`" in text
    # the recorded history carries the same frames after MemScope's label frame
    (pickle_path,) = (tmp_path / "rank00000").glob("memory_snapshot_steps*.pickle")
    import pickle

    snapshot = pickle.loads(pickle_path.read_bytes())
    framed = [e["frames"] for e in snapshot["device_traces"][0] if e["action"] == "alloc"]
    assert any(
        f[0]["filename"] == "memscope"
        and f"{f[1]['filename']}:{f[1]['line']} in {f[1]['name']}" == stack[0]
        for f in framed
        if len(f) > 1
    )


def test_markdown_and_the_page_payload_show_the_leak_and_the_changes():
    from memscope.reporters.html_payload import runtime_payload
    from memscope.reporters.markdown import render_runtime_markdown

    sizes = [100, 100, 101, 102, 103]
    rows = [_row(s, n * MiB, 200 * MiB) for s, n in enumerate(sizes)]
    section = StepTransitionAnalyzer().sections({"steps": rows})["step_transitions"]
    text = render_runtime_markdown({"step_transitions": section})
    assert "- **leak candidate**, steps 2–4: allocated grew 1.00 MiB per step" in text
    assert "| 3 | leak candidate | +1.00 MiB | 0 B | n/a |" in text
    payload = runtime_payload({"step_transitions": section}, max_rows=2)
    shown = payload["step_transitions"]
    assert len(shown["transitions"]) == 2 and shown["transitions_total"] == 3


def test_leak_suspects_group_survivors_by_where_they_were_born():
    from memscope.analysis.step_transitions import leak_suspects
    from memscope.events.schema import Survivor

    survivors = [
        Survivor("forward", "decoder.layers.1.mlp", 0, None, birth, 4096, 1) for birth in (3, 4)
    ] + [Survivor("backward", "decoder.layers.0", 2, 1, 4, 1024, 2)]
    (big, small) = leak_suspects(survivors)
    assert (big["module"], big["birth_steps"], big["bytes"], big["bytes_per_step"]) == (
        "decoder.layers.1.mlp", [3, 4], 8192, 4096)  # fmt: skip
    assert (small["phase"], small["microbatch"], small["virtual_chunk"], small["count"]) == (
        "backward", 2, 1, 2)  # fmt: skip
    assert leak_suspects(survivors, limit=1) == [big]


def test_one_time_model_state_growth_inside_a_leak_run_is_not_leak():
    # the optimizer's state appears at step 2 (its first real step: 1 and 0 were skipped, as
    # loss-scale overflows skip them) on top of a 1 MiB/step activation leak
    acts = [0, 1, 2, 3, 4]
    rows = []
    for s, a in enumerate(acts):
        opt = 50 * MiB if s >= 2 else 0
        cats = {"activations": a * MiB, "optimizer_state": opt}
        rows.append(_row(s, 100 * MiB + a * MiB + opt, 300 * MiB, categories_end=cats))
    rows[0]["categories_start"] = {"activations": 0, "optimizer_state": 0}
    section = StepTransitionAnalyzer().sections({"steps": rows})["step_transitions"]
    (leak,) = section["leaks"]
    assert (leak["first_step"], leak["bytes_per_step"], leak["bytes_added"]) == (1, MiB, 4 * MiB)
    assert "less 52428800 bytes of one-time" in leak["rate_basis"]
    by_step = {t["step"]: t for t in section["transitions"]}
    assert "52428800 bytes of it one-time growth" in by_step[2]["cause"]
    assert "activations grew most" in by_step[2]["cause"]  # not the optimizer's state


def test_a_one_time_jump_inside_a_leak_is_not_its_rate_without_categories():
    # the cuda backend classifies nothing: the optimizer's state (50 MiB) appears at step 2,
    # its first real step, on top of a 1 MiB/step leak; the median ignores the one-off jump
    sizes = [100, 101, 153, 154, 155]  # MiB
    rows = [_row(s, n * MiB, 300 * MiB) for s, n in enumerate(sizes)]
    section = StepTransitionAnalyzer().sections({"steps": rows})["step_transitions"]
    (leak,) = section["leaks"]
    assert (leak["first_step"], leak["last_step"], leak["bytes_per_step"]) == (1, 4, MiB)


@pytest.mark.integration
def test_a_leak_from_step_0_is_rated_from_the_steps_after_the_optimizer_state_exists(
    tmp_path, small_cfg
):
    result = run_in_process(small_cfg, 6, ["--memscope", "--memscope-outdir", str(tmp_path)],
                            leak_from_step=0)  # fmt: skip
    section = load_json(result.report_path)["step_transitions"]
    leaked = small_cfg.seq_length * small_cfg.micro_batch_size * small_cfg.hidden_size * 4
    (leak,) = section["leaks"]
    # step 0 also creates Adam's state (and the global memory buffer): never leak
    assert (leak["first_step"], leak["last_step"], leak["bytes_per_step"]) == (1, 5, leaked)
    assert "first traced step (0) grew once and is left out" in leak["rate_basis"]
    first = section["transitions"][0]
    assert (first["step"], first["kind"]) == (0, "one_time_growth")
    assert first["category_deltas"]["optimizer_state"] == result.optimizer_state_bytes
    (suspect,) = leak["suspects"]
    # what is leaking: the MLP's fc2 output, as the op that created the storage shaped it
    assert suspect["dtype"] == "float32"
    assert 4 * prod(suspect["shape"]) == leaked == suspect["bytes_per_step"]
    text = (tmp_path / "rank00000" / "runtime_report.md").read_text()
    shape = ", ".join(str(n) for n in suspect["shape"])
    assert f"suspect `decoder.layers.0.mlp.linear_fc2` (forward, microbatch 0): `[{shape}]` " \
        "float32 16.00 KiB per step" in text  # fmt: skip
