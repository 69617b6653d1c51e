"""analyze-log on an arguments block that dates its run to a range of megatron-core releases
(``megatron_versions.release_range``): the run is read, checked and estimated as the newest
release of the range that accepts it, and each older release whose terms differ is an
alternative the verdict names when the measurement fits it instead (``explained_if``)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from memscope.analysis.log_check import check_rank
from memscope.analysis.static.megatron_versions import ReleaseRange, release_range
from memscope.inputs.config_files import spec_from_flagscale_yaml
from memscope.inputs.log_document import explain_run
from memscope.inputs.log_spec import run_spec
from memscope.inputs.training_log import read_file_runs

LOGS = pathlib.Path(__file__).parent / "data" / "logs"
MIB = 2**20
#: Arguments a block of megatron-core 0.8 to 0.14 prints (it has no glu_linear_offset).
FROM_0_8 = dict(bias_swiglu_fusion=True, cross_entropy_loss_fusion=False)
#: A small dropless MoE GPT, allgather dispatcher, no biases (as 0.13 and 0.14 require).
MOE = dict(
    num_layers=2, hidden_size=256, num_attention_heads=8, seq_length=1024,
    max_position_embeddings=1024, padded_vocab_size=1024, micro_batch_size=4,
    global_batch_size=4, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
    world_size=1, bf16=True, num_experts=8, moe_router_topk=8, moe_ffn_hidden_size=4096,
    ffn_hidden_size=1024, moe_token_dispatcher_type="allgather", add_bias_linear=False,
    transformer_impl="local", log_interval=1,
)  # fmt: skip


def _log(tmp_path: pathlib.Path, max_allocated_mib: float, **args: Any) -> Any:
    """A log with an arguments block as Megatron's ``_print_args`` prints it and one memory
    line after 10 iterations (a test input built here, as in test_analyze_log)."""
    lines = ["------------------------ arguments ------------------------"]
    for name, value in sorted(args.items(), key=lambda kv: kv[0].lower()):
        lines.append(f"  {name} {'.' * (48 - len(name))} {value}")
    lines.append("-------------------- end of arguments ---------------------")
    lines.append(
        " iteration       10/      10 | lm loss: 1.0E+01 | number of skipped iterations:   0 |"
    )
    lines.append(
        f"[Rank 0] (after 10 iterations) memory (MB) | allocated: 100.00 | max allocated: "
        f"{max_allocated_mib:.2f} | reserved: 9000.00 | max reserved: 9000.00"
    )
    path = tmp_path / "run.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = read_file_runs(str(path))
    return run


def test_a_block_is_dated_to_a_range_and_its_spans_of_equal_terms():
    dated = release_range({"fp16", "bias_swiglu_fusion", "cross_entropy_loss_fusion"})
    assert dated == ReleaseRange((0, 8), (0, 15), "glu_linear_offset")
    assert dated.describe() == "0.8 to 0.14" and dated.newest == "0.14"
    # 0.14.0rc4: Megatron's linears keep Transformer Engine's cached placeholder gradients;
    # 0.13 changed the MoE terms
    assert dated.distinct_releases() == ("0.14", "0.13", "0.12")
    oldest = release_range({"fp16"})
    assert oldest is not None and oldest.describe() == "0.4 or older"


def test_an_older_release_that_fits_the_measurement_is_named_beside_the_verdict(tmp_path):
    """0.13 moved the routing weights into the experts (a weighted ffn-wide copy per routed
    token instead of the dispatcher's [n, h] output): on this MoE model 0.12 and 0.14
    differ by far more than the band. A peak measured at 0.12's estimate is outside the
    band of 0.14's (which the estimate follows) and the verdict names megatron-core 0.12."""
    spec = run_spec(_log(tmp_path, 100.0, **MOE, **FROM_0_8))
    assert spec.spec.model.megatron_core_version == "0.14"
    assert [o.name for o in spec.unlogged] == ["megatron-core 0.13", "megatron-core 0.12"]
    older = spec.unlogged[-1]
    measured = {"allocated": 100.0, "max_allocated": 100.0, "reserved": 0.0, "max_reserved": 0.0}
    newest = check_rank(spec.spec, 0, measured, 10, 10)
    assert newest["verdict"]["explained_if"] == []  # 100 MiB fits no release
    at_0_12 = check_rank(older.apply(spec.spec), 0, measured, 10, 10)["estimate"]
    new, old = newest["estimate"]["max_allocated_bytes"], at_0_12["max_allocated_bytes"]
    assert (new - old) / new > 2 * newest["verdict"]["band"]
    verdict = explain_run(_log(tmp_path, old / MIB, **MOE, **FROM_0_8))["ranks"][0]["verdict"]
    assert verdict["status"] == "below"
    assert [a["setting"] for a in verdict["explained_if"]] == ["megatron-core 0.12"]
    assert abs(verdict["explained_if"][0]["error_ratio"]) < 1e-4


def test_a_run_the_newest_release_refuses_follows_an_older_one_that_accepts_it(tmp_path):
    """Expert biases: 0.13 and 0.14 refuse them ("Bias is not supported for MoE"), 0.12 took
    them. A 0.8-to-0.14 block of an MoE model with biases is therefore a 0.12-or-older run,
    estimated with 0.12's terms, and the note says why."""
    run = _log(tmp_path, 3000.0, **{**MOE, "add_bias_linear": True}, **FROM_0_8)
    spec = run_spec(run)
    assert spec.spec.model.megatron_core_version == "0.12" and spec.unlogged == ()
    note = spec.notes[-1]
    assert "it is megatron-core 0.8 to 0.14" in note and "megatron-core 0.14 refuses it" in note
    assert "estimated with megatron-core 0.12's terms" in note
    assert explain_run(run)["error"] is None


def test_a_pre_0_15_layout_without_the_mtp_layers_is_read_as_that_release_built_it(tmp_path):
    """Before 0.15 a pipeline layout could not name the MTP layers (megatron-core raised for
    an ``m``) and they were built on the last stage. Such a block was refused when it was
    checked as the installed release; it is now read as its own."""
    args = dict(
        MOE, num_layers=4, pipeline_model_parallel_size=2, world_size=2, mtp_num_layers=1,
        pipeline_model_parallel_layout="Et|tttL",
    )  # fmt: skip
    spec = run_spec(_log(tmp_path, 3000.0, **args, **FROM_0_8))
    assert spec.spec.parallel.layout == ("Et", "tttmL")
    with pytest.raises(ValueError, match="0 MTP layers"):
        spec_from_flagscale_yaml({"system": {**args, **FROM_0_8}})  # as the installed release


def test_a_range_says_which_releases_it_spans_or_refuses_to_be_empty():
    with pytest.raises(ValueError, match="empty release range"):
        ReleaseRange((0, 15), (0, 8), "cross_entropy_loss_fusion")
    with pytest.raises(ValueError, match="no release before"):
        ReleaseRange(None, (1, 0), "a_future_argument")
    # an argument as new as one the block lacks: renamed since, the block is not dated
    assert release_range({"bias_swiglu_fusion", "glu_linear_offset"}) is None


def test_every_release_constant_is_a_term_boundary():
    """TERM_RELEASES lists every release constant of megatron_versions (each marks where a
    term or check changes), so a range's spans of equal terms miss none."""
    from memscope.analysis.static import megatron_versions as mv

    constants = {
        value
        for name, value in vars(mv).items()
        if name.isupper() and isinstance(value, tuple) and value and isinstance(value[0], int)
    }
    assert constants == set(mv.TERM_RELEASES)


def test_a_run_every_release_of_its_range_refuses_says_so_once(tmp_path):
    """An MoE model with expert biases under expert tensor parallelism 2 is refused by every
    release the block can come from (0.12 with the alltoall dispatcher refused a bias)."""
    args = {**MOE, "add_bias_linear": True, "moe_token_dispatcher_type": "alltoall",
            "world_size": 2, "global_batch_size": 8, "expert_model_parallel_size": 2}  # fmt: skip
    error = explain_run(_log(tmp_path, 3000.0, **args, **FROM_0_8))["error"]
    assert error is not None and error.count("dates the run to megatron-core 0.8 to 0.14") == 1
    assert "megatron-core 0.14 refuses it" in error and "megatron-core 0.12 refuses it" in error
    assert error.count("bias") >= 2, error  # each release's own reason
