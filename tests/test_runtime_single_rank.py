"""MemScopeMegatronRuntime on a real megatron-core GPTModel, one rank, real schedule."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os

import pytest
from conftest import load_json, read_jsonl, run_in_process

from memscope.events.schema import PHASE_ORDER, SCHEMA_VERSION

pytestmark = [pytest.mark.integration, pytest.mark.megatron_versions]


def test_report_has_the_original_keys_and_typed_metadata(traced_run):
    _, report, outdir = traced_run
    for key in ("runtime_trace", "peak", "top_events", "comparisons", "metadata"):
        assert key in report
    assert report["schema_version"] == SCHEMA_VERSION
    assert report["status"] == "complete" and report["errors"] == []
    for key in ("phase", "module", "step", "memory_bytes", "reserved_bytes"):
        assert key in report["peak"]
    meta = report["metadata"]
    assert meta["rank"] == 0 and meta["world_size"] == 1
    assert isinstance(meta["tp_size"], int) and meta["tp_size"] == 1
    assert meta["backend"] == "storage" and meta["dtype"] == "float32"
    assert meta["megatron_core_version"] == importlib.metadata.version("megatron-core")
    assert meta["steps_completed"] == 4
    assert os.path.exists(os.path.join(outdir, "rank00000", "runtime_report.md"))
    event = report["runtime_trace"][0]
    original = {
        "event_type", "module", "phase", "step", "mem_allocated_before", "mem_allocated_after",
        "mem_reserved_before", "mem_reserved_after", "max_mem_allocated", "max_mem_reserved",
        "delta_allocated", "delta_reserved", "inputs", "outputs", "grads", "notes",
    }  # fmt: skip
    added = {"timestamp", "rank", "microbatch", "pipeline_stage", "virtual_chunk",
             "module_class", "recompute"}  # fmt: skip
    assert original | added <= set(event)


def test_comparisons_hold_this_ranks_static_estimate(traced_run):
    """finalize() fills comparisons from the run's own args, persistent terms exact (the 3%
    peak bound is checked in fresh processes by test_static_accuracy: in this pytest process
    tensors left by earlier tests are live memory too)."""
    result, report, _ = traced_run
    comp = report["comparisons"]
    assert comp["status"] == "ok" and comp["static_source"].startswith("memscope static")
    assert comp["runtime_peak_memory_bytes"] == report["peak"]["memory_bytes"]
    assert comp["static_peak_memory_bytes"] > 0 and comp["peak_diff_ratio"] is not None
    assert (
        comp["peak_diff_bytes"] == comp["static_peak_memory_bytes"] - report["peak"]["memory_bytes"]
    )
    parts = {c["component"]: c for c in comp["components"]}
    for name in ("parameters", "gradients", "optimizer_state"):
        assert parts[name]["diff_bytes"] == 0, parts[name]
    assert parts["parameters"]["static_bytes"] == result.param_bytes


def test_failing_estimator_still_writes_the_report_and_says_why(tmp_path, small_cfg):
    result = run_in_process(
        small_cfg, 2, ["--memscope", "--memscope-outdir", str(tmp_path)], fault="static_estimator"
    )
    report = load_json(result.report_path)
    comp = report["comparisons"]
    assert report["status"] == "complete" and comp["status"] == "missing"
    assert "injected fault in static_estimator" in comp["reason"]
    assert comp["static_peak_memory_bytes"] is None and comp["runtime_peak_memory_bytes"] > 0
    markdown = (tmp_path / "rank00000" / "runtime_report.md").read_text()
    assert "Static estimate missing: the static estimator failed" in markdown


def test_parameter_and_optimizer_bytes_are_exact(traced_run):
    result, report, _ = traced_run
    end = report["steps"][-1]["categories_end"]
    assert end["parameters"] == result.param_bytes
    assert end["optimizer_state"] == result.optimizer_state_bytes
    assert end["gradients"] == result.param_bytes  # fp32 grads, every param trained


def test_peak_is_the_true_high_water_mark(traced_run):
    _, report, _ = traced_run
    events = report["runtime_trace"]
    peak = report["peak"]["memory_bytes"]
    assert peak == max(e["max_mem_allocated"] for e in events)
    assert peak >= max(e["mem_allocated_after"] for e in events)
    assert report["peak"]["attribution"] == "exact"
    assert sum(report["peak"]["categories"].values()) == peak


def test_peak_composition_sums_to_the_peak_and_names_who_created_it(traced_run):
    result, report, _ = traced_run
    peak = report["peak"]
    composition = peak["composition"]
    items = composition["items"]
    assert composition["total_bytes"] == sum(i["bytes"] for i in items) == peak["memory_bytes"]
    assert composition["unattributed_bytes"] == 0
    by_category: dict[str, int] = {}
    for item in items:
        by_category[item["category"]] = by_category.get(item["category"], 0) + item["bytes"]
    assert by_category == {k: v for k, v in peak["categories"].items() if v}
    assert by_category["parameters"] == result.param_bytes  # the model's real tensors
    named = [i["bytes"] for i in items if i["module"] != "(rest)"]
    assert named == sorted(named, reverse=True)  # largest first
    # activations are attributed to the module (and microbatch) that created them; what is
    # created outside every module (batch tensors, the loss) keeps its phase and microbatch
    activations = [i for i in items if i["category"] == "activations"]
    in_modules = sum(i["bytes"] for i in activations if i["module"])
    assert in_modules >= 0.9 * by_category["activations"]
    assert all(i["microbatch"] is not None for i in activations if i["phase"] == "forward")
    # at the peak (in backward) saved activations and temporaries are told apart
    assert {i["saved"] for i in activations} == {True, False}
    assert all(i["saved"] is None for i in items if i["category"] != "activations")
    forward = [
        i for i in activations if i["module"][:1] not in ("", "(") and i["phase"] == "forward"
    ]
    assert forward and {i["virtual_chunk"] for i in forward} == {0}


def test_step_phase_deltas_are_real(traced_run):
    result, report, _ = traced_run
    phases = [e for e in report["runtime_trace"] if e["event_type"] == "step_phase"]
    first_opt = next(e for e in phases if e["phase"] == "optimizer" and e["step"] == 0)
    # Adam's moments (and step counters) appear in the first optimizer step.
    assert first_opt["delta_allocated"] == result.optimizer_state_bytes
    fb = next(e for e in phases if e["phase"] == "forward_backward" and e["step"] == 1)
    assert fb["delta_allocated"] > 0  # gradients created during backward
    assert fb["max_mem_allocated"] > fb["mem_allocated_after"]  # activations came and went


def test_keyword_inputs_and_microbatches_are_recorded(traced_run, small_cfg):
    _, report, _ = traced_run
    roots = [
        e for e in report["runtime_trace"]
        if e["event_type"] == "module_forward" and e["module"] == "model" and e["step"] == 0
    ]  # fmt: skip
    assert [e["microbatch"] for e in roots] == list(range(small_cfg.num_microbatches))
    names = {t.get("name") for t in roots[0]["inputs"]}
    assert "labels" in names  # passed as a keyword argument
    assert roots[0]["module_class"] == "GPTModel"


def test_grad_events_are_deduplicated_in_top_events(traced_run):
    _, report, _ = traced_run
    keys = [(t["event_type"], t["module"], t["phase"]) for t in report["top_events"]]
    assert len(keys) == len(set(keys))
    grads = [t for t in report["top_events"] if t["event_type"] == "param_grad"]
    assert all(t["count"] >= 4 for t in grads)  # one row folds every step and microbatch


def test_hooks_are_removed_and_do_not_pile_up(traced_run):
    result, report, _ = traced_run
    assert result.handles_left == 0
    meta = report["metadata"]
    assert meta["hook_handles_removed"] == 2 * meta["modules_hooked"] + 2 * meta["params_hooked"]


def test_trace_is_bounded_and_the_jsonl_has_every_event(traced_run):
    _, report, outdir = traced_run
    trace = report["trace"]
    kept_steps = {e["step"] for e in report["runtime_trace"] if e["event_type"] != "step_phase"}
    assert kept_steps == {0, 1} == set(trace["detail_steps"])
    step_events = [e for e in report["runtime_trace"] if e["event_type"] == "step_phase"]
    assert {e["step"] for e in step_events} == {0, 1, 2, 3}
    lines = read_jsonl(os.path.join(outdir, "rank00000", "trace.jsonl"))
    assert lines[0]["schema_version"] == SCHEMA_VERSION
    assert len(lines) - 1 == trace["events_recorded"]
    assert trace["events_in_report"] + trace["events_not_in_report"] == trace["events_recorded"]


def test_memscope_off_and_on_give_identical_losses_and_gradients(traced_run, small_cfg):
    traced, _, _ = traced_run
    plain = run_in_process(small_cfg, 4, None)
    assert plain.losses == traced.losses
    assert plain.grad_digest == traced.grad_digest and plain.param_digest == traced.param_digest


def test_full_recompute_forwards_are_flagged(tmp_path, small_cfg):
    cfg = dataclasses.replace(small_cfg, recompute="full")
    result = run_in_process(cfg, 2, ["--memscope", "--memscope-outdir", str(tmp_path)])
    events = load_json(result.report_path)["runtime_trace"]
    recomputed = [e for e in events if e["recompute"]]
    assert recomputed and all(e["phase"] == "recompute" for e in recomputed)
    layers = {e["module"] for e in recomputed}
    assert any(m.startswith("decoder.layers.") for m in layers)
    # A recomputed forward belongs to the microbatch being back-propagated.
    assert {e["microbatch"] for e in recomputed} <= set(range(cfg.num_microbatches))


def test_step_window_limits_module_events(tmp_path, small_cfg):
    argv = ["--memscope", "--memscope-outdir", str(tmp_path), "--memscope-step-start", "2"]
    report = load_json(run_in_process(small_cfg, 3, argv).report_path)
    fine_steps = {e["step"] for e in report["runtime_trace"] if e["event_type"] != "step_phase"}
    assert fine_steps == {2}
    assert len(report["steps"]) == 3  # step phases are still recorded for every step


FAULT_SITES = {
    "module_hooks": {"module_hooks"},
    "output_grads": {"output_grad_hooks"},
    "param_grads": {"param_grad_hooks"},
    "step_callbacks": {
        "on_forward_backward_end",
        "on_optimizer_step_start",
        "on_optimizer_step_end",
    },
    "schedule_regions": {"schedule_regions"},
}


@pytest.mark.parametrize("fault", sorted(FAULT_SITES))
def test_a_failing_hook_never_changes_training(tmp_path, small_cfg, traced_run, fault):
    traced, _, _ = traced_run
    argv = ["--memscope", "--memscope-outdir", str(tmp_path)]
    result = run_in_process(small_cfg, 4, argv, fault=fault)
    assert result.losses == traced.losses and result.grad_digest == traced.grad_digest
    report = load_json(result.report_path)
    # that part switched itself off, so what it records has gaps: not complete, and why
    assert report["status"] == "incomplete" and not report["complete"]
    sites = {e["site"]: e for e in report["errors"]}
    assert set(sites) == FAULT_SITES[fault]
    assert all(site in report["status_reason"] for site in sites)
    for entry in sites.values():
        assert entry["count"] == 1  # reported once, then that part is switched off
        assert f"injected fault in {fault}" in entry["first_error"]
    assert result.handles_left == 0
    assert len(report["steps"]) == 4  # the rest of tracing carried on
    assert not _megatron_schedule_wrapped()  # whatever MemScope wrapped is restored


def _megatron_schedule_wrapped() -> bool:
    from megatron.core.pipeline_parallel import p2p_communication, schedules

    functions = (schedules.forward_step, p2p_communication.P2PCommunicator._communicate)
    return any(hasattr(f, "__wrapped__") for f in functions)


def test_the_schedules_own_allocations_are_named_regions_while_tracing(traced_run):
    """Megatron's forward_step (batch and loss) and pipeline p2p are wrapped while tracing,
    restored after; what forward_step allocates outside the model is named after it."""
    _, report, _ = traced_run
    assert not _megatron_schedule_wrapped()
    items = report["peak"]["composition"]["items"]
    regions = {i["module"] for i in items if i["module"].startswith("(")}
    assert "(forward_step)" in regions  # this rank's batch tensors (and loss scalars)
    unnamed = [i for i in items if i["category"] == "activations" and not i["module"]]
    assert sum(i["bytes"] for i in unnamed) <= 64


def test_grad_event_deltas_are_measured_not_copied(tmp_path, small_cfg):
    # grads allocated by backward (set_to_none), so each first allocation is visible
    cfg = dataclasses.replace(small_cfg, grad_buffer=False)
    result = run_in_process(cfg, 2, ["--memscope", "--memscope-outdir", str(tmp_path)])
    events = load_json(result.report_path)["runtime_trace"]
    for kind in ("param_grad", "output_grad"):
        evs = [e for e in events if e["event_type"] == kind]
        assert evs and any(e["delta_allocated"] != 0 for e in evs)
        for e in evs:
            assert e["delta_allocated"] == e["mem_allocated_after"] - e["mem_allocated_before"]
    # A gradient's allocation is attributed to its parameter's event (the event spans from
    # the previous sample); within one fused backward op two grads can share one interval.
    first_mb = [e for e in events if e["event_type"] == "param_grad" and e["microbatch"] == 0]
    exact = [e for e in first_mb if e["delta_allocated"] == e["grads"][0]["bytes"] > 0]
    assert len(exact) >= 4


def test_profiler_runs_on_its_schedule_and_only_on_its_ranks(tmp_path, small_cfg):
    argv = ["--memscope", "--memscope-outdir", str(tmp_path), "--memscope-enable-profiler",
            "--memscope-profiler-wait", "1", "--memscope-profiler-warmup", "0",
            "--memscope-profiler-active", "1"]  # fmt: skip
    report = load_json(run_in_process(small_cfg, 3, argv).report_path)
    traces = sorted(os.listdir(tmp_path / "rank00000" / "profiler"))
    assert len(traces) == 1 and traces[0].endswith(".json")
    assert report["artifacts"]["profiler_trace_0"] == os.path.join("profiler", traces[0])
    trace = load_json(str(tmp_path / "rank00000" / "profiler" / traces[0]))
    assert any(ev.get("name") == "[memory]" for ev in trace["traceEvents"])
    other = tmp_path / "other"
    argv2 = ["--memscope", "--memscope-outdir", str(other), "--memscope-enable-profiler",
             "--memscope-profiler-ranks", "1"]  # fmt: skip
    run_in_process(small_cfg, 2, argv2)
    assert not (other / "rank00000" / "profiler").exists()


def test_snapshot_without_cuda_records_the_storage_ledgers_history(tmp_path, small_cfg):
    argv = ["--memscope", "--memscope-outdir", str(tmp_path), "--memscope-enable-memory-snapshot",
            "--memscope-snapshot-steps", "1"]  # fmt: skip
    report = load_json(run_in_process(small_cfg, 2, argv).report_path)
    assert not any("snapshot" in w for w in report["warnings"])
    rank = tmp_path / "rank00000"
    for name in ("memory_snapshot_steps0-0.pickle", "memory_snapshot_steps0-0.owners.json",
                 "memory_snapshot_steps0-0.markers.jsonl"):  # fmt: skip
        assert (rank / name).exists(), name


def test_cuda_backend_without_a_gpu_is_a_clear_error(tmp_path, small_cfg, caplog):
    from memscope.demo.traced_training import megatron_like_args
    from memscope.integrations.megatron import MemScopeMegatronRuntime

    args = megatron_like_args(small_cfg, ["--memscope", "--memscope-backend", "cuda",
                                          "--memscope-outdir", str(tmp_path)])  # fmt: skip
    runtime = MemScopeMegatronRuntime.from_megatron_args(args)
    runtime.start()  # never raises into training: one line, and this rank goes untraced
    assert not runtime.active
    assert "needs a CUDA device" in runtime.session.start_error
    lines = [r.getMessage() for r in caplog.records if "needs a CUDA device" in r.getMessage()]
    assert len(lines) == 1


def test_a_rank_outside_memscope_ranks_is_inert(tmp_path, small_cfg):
    argv = ["--memscope", "--memscope-outdir", str(tmp_path), "--memscope-ranks", "1"]
    result = run_in_process(small_cfg, 1, argv)
    assert result.report_path is None and not os.listdir(tmp_path)


def test_hook_steps_limits_module_events_to_the_first_steps_of_the_window(tmp_path, small_cfg):
    """Steps 1-2 record; the hooks are off the model for step 0 (before the window) and from
    step 3 on (past --memscope-hook-steps), so those steps run the model untouched."""
    argv = ["--memscope", "--memscope-outdir", str(tmp_path), "--memscope-step-start", "1",
            "--memscope-hook-steps", "2", "--memscope-detail-steps", "5"]  # fmt: skip
    result = run_in_process(small_cfg, 5, argv)
    report = load_json(result.report_path)
    fine_steps = {e["step"] for e in report["runtime_trace"] if e["event_type"] != "step_phase"}
    assert fine_steps == {1, 2}
    assert [s["step"] for s in report["steps"]] == [0, 1, 2, 3, 4]
    meta = report["metadata"]
    handles = 2 * meta["modules_hooked"] + 2 * meta["params_hooked"]
    assert handles > 0 and result.handles_per_step == [0, handles, handles, 0, 0]
    assert meta["hooks_suspended"] == 2  # before step 0 and before step 3
    assert meta["hook_handles_removed"] == 2 * handles and result.handles_left == 0


def test_a_failed_start_leaves_no_dispatch_mode_or_hooks(tmp_path, small_cfg, monkeypatch):
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from memscope.demo.launcher import free_port
    from memscope.demo.tiny_gpt import build_model, destroy_process, init_process
    from memscope.demo.traced_training import megatron_like_args
    from memscope.integrations.megatron import MemScopeMegatronRuntime
    from memscope.session.recorders import Recorders

    def broken(self, *args):
        raise OSError("disk full")

    monkeypatch.setattr(Recorders, "start", broken)
    init_process(0, 1, free_port(), small_cfg)
    try:
        chunks = build_model(small_cfg)
        rt = MemScopeMegatronRuntime.from_megatron_args(
            megatron_like_args(small_cfg, ["--memscope", "--memscope-outdir", str(tmp_path)])
        )
        rt.attach_model(chunks)
        rt.start()  # the failure is logged, never raised into training
        assert "disk full" in rt.session.start_error
        assert _get_current_dispatch_mode() is None
        assert not rt.active
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in chunks[0].modules())
        assert torch.ones(2).sum().item() == 2.0
    finally:
        destroy_process()


def test_attach_model_unwraps_ddp_and_float16_module(tmp_path, small_cfg):
    import torch
    from megatron.core.transformer.module import Float16Module

    from memscope.demo.launcher import free_port
    from memscope.demo.tiny_gpt import build_model, destroy_process, init_process
    from memscope.demo.traced_training import megatron_like_args
    from memscope.integrations.megatron import MemScopeMegatronRuntime

    init_process(0, 1, free_port(), small_cfg)
    try:
        (chunk,) = build_model(small_cfg)
        chunk.config.bf16 = True
        wrapped = torch.nn.parallel.DistributedDataParallel(Float16Module(chunk.config, chunk))
        rt = MemScopeMegatronRuntime.from_megatron_args(
            megatron_like_args(small_cfg, ["--memscope", "--memscope-outdir", str(tmp_path)])
        )
        rt.attach_model([wrapped])
        assert rt.session.chunks == [chunk]
        rt.start()
        assert rt.session.hook_counts["modules_hooked"] == len(list(chunk.modules()))
        rt.finalize()
        assert rt.session.hook_counts["hook_handles_removed"] > 0
        assert all(not m._forward_hooks for m in chunk.modules())
    finally:
        destroy_process()


def test_the_peak_steps_active_memory_is_the_replayed_history_band_by_band(history_run):
    """The active-memory timeline of a real run: its top edge is the ledger's allocated bytes,
    its highest point the run's true peak, and at that point the bands split by category as
    the peak composition does."""
    _, report, _ = history_run
    history = report["allocator_timeline"]
    active = history["active_memory"]
    assert active["step"] == history["peak_context"]["step"] == report["peak"]["step"]
    samples = len(active["time_us"])
    assert 2 < samples <= 603 and active["time_us"] == sorted(active["time_us"])
    totals = [sum(b["bytes"][k] for b in active["bands"]) for k in range(samples)]
    at = active["peak_index"]
    assert totals[at] == max(totals) == report["peak"]["memory_bytes"]
    by_band: dict[str, int] = {}
    for band in active["bands"]:
        by_band[band["category"]] = by_band.get(band["category"], 0) + band["bytes"][at]
    by_item: dict[str, int] = {}
    for item in history["composition"]["items"]:
        by_item[item["category"]] = by_item.get(item["category"], 0) + item["bytes"]
    assert {k: v for k, v in by_band.items() if v} == by_item
    # activations are banded by the module and phase that allocated them
    labels = {b["label"] for b in active["bands"] if b["category"] == "activations"}
    assert any(label.startswith("forward · decoder.layers.") for label in labels)
    assert any(label.startswith("backward · ") for label in labels)


def test_phase_maxima_are_within_each_phase(traced_run):
    """The optimizer's max allocated is what the optimizer reached, not the step's
    high-water mark that backward set: with the storage backend, its own running peak
    (exact), checked against the trace's step phases: never below the phase's readings,
    never above the step's mark, and equal to it in a step where the optimizer raised it."""
    _, report, outdir = traced_run
    phases = {row["phase"]: row for row in report["phase_summary"]}
    backward, optimizer = phases["backward"], phases["optimizer"]
    assert optimizer["max_mem_allocated_source"] == "phase_peak"
    assert optimizer["max_mem_allocated"] < backward["max_mem_allocated"]
    assert backward["max_mem_allocated"] == report["peak"]["memory_bytes"]
    lines = read_jsonl(os.path.join(outdir, "rank00000", "trace.jsonl"))
    by_step: dict[int, dict[str, dict]] = {}
    for e in lines:
        if e.get("event_type") == "step_phase":
            by_step.setdefault(e["step"], {})[e["phase"]] = e
    for step_phases in by_step.values():
        opt, pre = step_phases["optimizer"], step_phases["pre_optimizer"]
        own = opt["phase_max_allocated"]
        assert max(opt["mem_allocated_before"], opt["mem_allocated_after"]) <= own
        assert own <= opt["max_mem_allocated"]
        if opt["max_mem_allocated"] > pre["max_mem_allocated"]:  # it raised the step's mark
            assert own == opt["max_mem_allocated"]
        else:  # Adam's temporaries: above what the phase's boundaries read
            assert own > max(opt["mem_allocated_before"], opt["mem_allocated_after"])
    assert optimizer["max_mem_allocated"] == max(
        st["optimizer"]["phase_max_allocated"] for st in by_step.values()
    )
    step_peaks = [row["peak_allocated"] for row in report["steps"]]
    assert optimizer["max_mem_allocated"] < max(step_peaks)
    # the first step creates the optimizer state: its optimizer phase sets that step's peak
    first = report["steps"][0]
    assert first["phase_peaks"]["optimizer"] == first["peak_allocated"]
    assert report["steps"][-1]["phase_peaks"]["optimizer"] < report["steps"][-1]["peak_allocated"]


def test_phases_are_listed_in_one_order(traced_run):
    _, report, _ = traced_run
    order = [row["phase"] for row in report["phase_summary"]]
    assert order == [p for p in PHASE_ORDER if p in order]
    assert list(report["steps"][-1]["phase_peaks"]) == [
        "forward_backward",
        "pre_optimizer",
        "optimizer",
        "step",
    ]


def test_top_events_tell_leaves_from_containers_and_mark_the_peak(traced_run):
    from memscope.reporters.markdown import render_runtime_markdown

    _, report, _ = traced_run
    kinds = {
        row["module"]: row.get("leaf")
        for row in report["top_events"]
        if row["event_type"] == "module_forward"
    }
    assert kinds.get("model") is False and kinds.get("decoder") is False
    assert kinds.get("output_layer") is True
    top = render_runtime_markdown(report).split("## Top events")[1].split("\n## ")[0]
    peak = report["peak"]
    marked = [line for line in top.splitlines() if line.startswith("|") and "← peak" in line]
    assert len(marked) == 1 and f"`{peak['module']}`" in marked[0]
    assert f"| {peak['phase']} |" in marked[0]
