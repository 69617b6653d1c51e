"""Two real processes (gloo): megatron-core GPT at TP=2, PP=2 (1F1B) and interleaved PP."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import load_json
from harness import instrumented_worker

from memscope.demo.launcher import free_port, spawn
from memscope.demo.tiny_gpt import TinyGPTConfig
from memscope.reporters.markdown import render_runtime_markdown

pytestmark = [pytest.mark.multiprocess, pytest.mark.integration, pytest.mark.megatron_versions]

BASE = TinyGPTConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_microbatches=4)
STEPS = 3


def _pair(tmp_path_factory, cfg: TinyGPTConfig, name: str, fault: str | None = None):
    outdir = str(tmp_path_factory.mktemp(name))
    argv = ["--memscope", "--memscope-outdir", outdir]
    traced = spawn(2, instrumented_worker, free_port(), cfg, STEPS, argv, fault)
    plain = spawn(2, instrumented_worker, free_port(), cfg, STEPS, None)
    reports = [load_json(r.report_path) for r in traced]
    return traced, plain, reports


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    return _pair(tmp_path_factory, dataclasses.replace(BASE, tp=2), "tp2")


@pytest.fixture(scope="module")
def pp2(tmp_path_factory):
    return _pair(tmp_path_factory, dataclasses.replace(BASE, pp=2), "pp2")


@pytest.mark.parametrize("fixture", ["tp2", "pp2"])
def test_losses_and_gradients_identical_with_memscope_on_and_off(fixture, request):
    traced, plain, _ = request.getfixturevalue(fixture)
    for on, off in zip(traced, plain, strict=True):
        assert on.losses == off.losses
        assert on.grad_digest == off.grad_digest and on.param_digest == off.param_digest


@pytest.mark.parametrize("fixture", ["tp2", "pp2"])
def test_parameter_and_optimizer_bytes_exact_per_rank(fixture, request):
    traced, _, reports = request.getfixturevalue(fixture)
    for result, report in zip(traced, reports, strict=True):
        end = report["steps"][-1]["categories_end"]
        assert end["parameters"] == result.param_bytes
        assert end["optimizer_state"] == result.optimizer_state_bytes
        assert end["gradients"] == result.param_bytes
        assert result.handles_left == 0
        assert report["status"] == "complete" and report["errors"] == []


def _composition_by_category(report: dict) -> dict[str, int]:
    """Check one rank's peak composition against its own peak; its bytes by category."""
    peak = report["peak"]
    items = peak["composition"]["items"]
    assert peak["composition"]["total_bytes"] == sum(i["bytes"] for i in items)
    assert peak["composition"]["total_bytes"] == peak["memory_bytes"]
    assert peak["composition"]["unattributed_bytes"] == 0
    by_category: dict[str, int] = {}
    for item in items:
        by_category[item["category"]] = by_category.get(item["category"], 0) + item["bytes"]
    # Activations carry the module that created them, or the schedule's region (forward_step:
    # batch and loss; pipeline p2p: receive buffers); what is left is a few bytes of the
    # schedule's own bookkeeping, with its phase.
    activations = [i for i in items if i["category"] == "activations"]
    outside = [i for i in activations if not i["module"]]
    assert all(i["phase"] for i in outside)
    assert sum(i["bytes"] for i in outside) <= 64 < by_category["activations"]
    return by_category


@pytest.mark.parametrize("fixture", ["tp2", "pp2"])
def test_each_rank_has_its_own_peak_composition(fixture, request):
    traced, _, reports = request.getfixturevalue(fixture)
    for result, report in zip(traced, reports, strict=True):
        by_category = _composition_by_category(report)
        assert by_category["parameters"] == result.param_bytes  # this rank's real tensors
        assert by_category["gradients"] == result.param_bytes
        stage = {i["module"] for i in report["peak"]["composition"]["items"] if i["module"]}
        if fixture == "pp2":  # each stage's activations come from its own modules
            first = report["metadata"]["pp_rank"] == 0
            assert ("embedding" in stage) is first  # the first stage embeds
            assert "output_layer" not in stage or not first
            assert "(pipeline p2p)" in stage  # a received activation or gradient is live
    if fixture == "pp2":  # under 1F1B the first stage keeps more microbatches' saved tensors
        flight = [
            {i["microbatch"] for i in r["peak"]["composition"]["items"]
             if i["category"] == "activations" and i["saved"] and i["phase"] == "forward"
             and not i["module"].startswith("(")}
            for r in reports
        ]  # fmt: skip
        assert len(flight[0]) > len(flight[1])
        # and as many as Megatron's 1F1B arithmetic predicts for each stage (4 microbatches:
        # stage 0 holds 2, the last stage 1)
        counts = [r["comparisons"]["in_flight"] for r in reports]
        assert [c["predicted"] for c in counts] == [2, 1]
        assert [c["measured"]["microbatches"] for c in counts] == [2, 1]


@pytest.mark.parametrize("fixture", ["tp2", "pp2"])
def test_both_ranks_of_a_launch_agree_on_one_run_id_through_the_store(fixture, request):
    *_, reports = request.getfixturevalue(fixture)
    # the launcher sets no run id: the ranks agreed on the first offer in the job's store
    metas = [r["metadata"] for r in reports]
    assert metas[0]["run_id"] == metas[1]["run_id"]
    assert {m["run_id_source"] for m in metas} == {"torch.distributed store"}
    assert metas[0]["pid"] != metas[1]["pid"]  # two processes, one run
    assert all(r["world_size"] == 2 and m["hostname"] and m["start_time"]
               for r, m in zip(reports, metas, strict=True))  # fmt: skip


def test_tp2_shards_parameters_and_labels_ranks(tp2):
    traced, _, reports = tp2
    assert [r["metadata"]["tp_rank"] for r in reports] == [0, 1]
    assert all(r["metadata"]["tp_size"] == 2 and r["world_size"] == 2 for r in reports)
    # Each TP rank holds the same shard sizes; both have a loss (TP ranks share the last stage).
    assert traced[0].param_bytes == traced[1].param_bytes
    assert all(loss is not None for r in traced for loss in r.losses)


def test_pp2_labels_stages_and_microbatches(pp2):
    traced, _, reports = pp2
    for stage, report in enumerate(reports):
        assert report["metadata"]["pp_rank"] == stage and report["metadata"]["pp_size"] == 2
        fwd = [e for e in report["runtime_trace"] if e["event_type"] == "module_forward"]
        assert {e["pipeline_stage"] for e in fwd} == {stage}
        roots = [e["microbatch"] for e in fwd if e["module"] == "model" and e["step"] == 0]
        assert roots == list(range(BASE.num_microbatches))
        grads = [e for e in report["runtime_trace"] if e["event_type"] == "output_grad"]
        assert {e["microbatch"] for e in grads if e["step"] == 0} == set(range(4))
    # Only the last stage computes the loss.
    assert all(loss is None for loss in traced[0].losses)
    assert all(loss is not None for loss in traced[1].losses)
    # The first stage holds the embedding, the last the output layer.
    mods0 = {m["module"] for m in reports[0]["module_summary"]}
    mods1 = {m["module"] for m in reports[1]["module_summary"]}
    assert "embedding" in mods0 and "output_layer" not in mods0
    assert "output_layer" in mods1 and "embedding" not in mods1
    # Megatron's own global layer numbers (1-based, stage offset included) label each stage's
    # local layers, in the Markdown too: stage 1's decoder.layers.0 is the model's layer L/2+1
    half = BASE.num_layers // 2
    for stage, report in enumerate(reports):
        numbers = report["metadata"]["layer_numbers"]
        assert numbers == {f"decoder.layers.{i}": stage * half + i + 1 for i in range(half)}
    md = render_runtime_markdown(reports[1])
    assert f"decoder.layers.0.mlp (layer {half + 1})" in md
    assert "decoder.layers.0.mlp (layer 1)" not in md


def test_interleaved_pipeline_hooks_every_virtual_chunk(tmp_path_factory):
    cfg = dataclasses.replace(BASE, pp=2, vpp=2, num_layers=4)
    traced, plain, reports = _pair(tmp_path_factory, cfg, "vpp")
    for on, off in zip(traced, plain, strict=True):
        assert on.losses == off.losses and on.grad_digest == off.grad_digest
    for report in reports:
        fwd = [e for e in report["runtime_trace"] if e["event_type"] == "module_forward"]
        assert {e["virtual_chunk"] for e in fwd} == {0, 1}
        roots = {e["module"] for e in fwd if e["module"].endswith(".model")}
        assert roots == {"chunk0.model", "chunk1.model"}
        # interleaved: chunk c of stage s holds global layer (c * pp + s) + 1 (one per chunk)
        stage = report["metadata"]["pp_rank"]
        assert report["metadata"]["layer_numbers"] == {
            f"chunk{c}.decoder.layers.0": c * cfg.pp + stage + 1 for c in range(2)
        }
        for chunk in ("chunk0.model", "chunk1.model"):
            mbs = [e["microbatch"] for e in fwd if e["module"] == chunk and e["step"] == 0]
            assert mbs == list(range(cfg.num_microbatches))
    for result, report in zip(traced, reports, strict=True):
        # each rank's peak composition, its activations split by the VPP chunk that made them
        assert _composition_by_category(report)["parameters"] == result.param_bytes
        items = report["peak"]["composition"]["items"]
        chunks = {
            i["virtual_chunk"]
            for i in items
            if i["category"] == "activations" and i["module"].startswith("chunk")
        }
        assert chunks == {0, 1}
        # the interleaved schedule's (chunk-)microbatches in flight at the peak, as predicted
        in_flight = report["comparisons"]["in_flight"]
        assert in_flight["measured"]["microbatches"] == in_flight["predicted"] > 1


def test_failing_output_grad_hooks_do_not_change_pipeline_training(tmp_path_factory, pp2):
    _, plain, _ = pp2
    cfg = dataclasses.replace(BASE, pp=2)
    outdir = str(tmp_path_factory.mktemp("fault"))
    argv = ["--memscope", "--memscope-outdir", outdir]
    faulty = spawn(2, instrumented_worker, free_port(), cfg, STEPS, argv, "output_grads")
    for on, off in zip(faulty, plain, strict=True):
        assert on.losses == off.losses and on.grad_digest == off.grad_digest
        assert {e["site"] for e in load_json(on.report_path)["errors"]} == {"output_grad_hooks"}
