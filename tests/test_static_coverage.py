"""analyze-static states its assumptions, the config keys it does not use and the
memory-relevant keys a config sets that it does not model (console, JSON, Markdown)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
import yaml

from memscope.analysis.static import coverage as cov
from memscope.analysis.static.coverage import config_coverage, is_set
from memscope.analysis.static.read_keys import READ_KEYS
from memscope.cli import main
from memscope.inputs.config_files import load_config, load_config_file
from memscope.inputs.megatron_args import spec_from_megatron_args
from memscope.reporters.static_markdown import render_static_markdown

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_YAML = os.path.join(REPO, "configs", "flagscale", "train", "tiny_gpt.yaml")
JSON_CONFIG = os.path.join(REPO, "configs", "static", "tiny_gpt.json")
TINY_JSON = os.path.join(REPO, "configs", "static", "tiny_gpt.json")


@dataclass
class Result:
    rc: int
    out: str
    err: str
    report: dict[str, Any]
    md: str

    @property
    def coverage(self) -> dict[str, Any]:
        return self.report["coverage"]

    def warnings(self) -> list[str]:
        return [x for x in self.err.splitlines() if ": warning: " in x]


@pytest.fixture
def cli(tmp_path, capsys) -> Callable[..., Result]:
    """``cli(config, *args)``: analyze-static into tmp_path/out, the reports read back."""

    def run(config: str, *args: str) -> Result:
        out = tmp_path / "out"
        rc = main(["analyze-static", "--config", config, "--outdir", str(out), *args])
        captured = capsys.readouterr()
        assert rc == 0, captured.err
        report = json.loads((out / "static_report.json").read_text())
        md = (out / "static_report.md").read_text()
        return Result(rc, captured.out, captured.err, report, md)

    return run


def _yaml(tmp_path, model: dict[str, Any] | None = None, system: dict[str, Any] | None = None):
    """The tiny FlagScale training YAML with ``model``/``system`` keys added."""
    with open(TINY_YAML) as f:
        config = yaml.safe_load(f)
    config["model"].update(model or {})
    config["system"].update(system or {})
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _keys(result: Result) -> list[str]:
    return [n["key"] for n in result.coverage["not_modelled"]]


# ---------------------------------------------------------------------------------------------
# Through the CLI


def test_unused_yaml_key_is_listed_in_json_markdown_and_console(tmp_path, cli):
    res = cli(_yaml(tmp_path, model={"my_custom_knob": 3}))
    unused = res.coverage["unused_keys"]
    assert "my_custom_knob" in unused and unused == sorted(unused)
    assert {"lr", "train_iters"} <= set(unused)  # Megatron/FlagScale keys
    assert "memscope_top_k" not in unused  # MemScope's own setting: the tracer reads it
    assert not set(unused) & READ_KEYS
    assert "## Assumptions and coverage" in res.md and "`my_custom_knob`" in res.md
    assert res.md.index("## Assumptions and coverage") < res.md.index("## Ranks")
    line = next(x for x in res.err.splitlines() if "not used: " in x)
    assert f"not used: {len(unused)} keys (" in line
    assert res.coverage["not_modelled"] == []  # nothing memory-relevant set
    assert not res.warnings() or all("not modelled" not in x for x in res.warnings())


def test_fp8_with_transformer_engine_is_modelled_and_says_it_is_not_measured(tmp_path, cli):
    system = {"fp8": "hybrid", "fp8_recipe": "tensorwise", "transformer_impl": "transformer_engine"}
    res = cli(_yaml(tmp_path, system=system))
    assert not any("not modelled" in x for x in res.warnings())
    assert not any(n["key"].startswith("fp8") for n in res.coverage["not_modelled"])
    assert not {"fp8", "fp8_recipe"} & set(res.coverage["unused_keys"])
    fp8 = [m for m in res.coverage["modelled"] if m.startswith("FP8 (tensorwise recipe")]
    assert len(fp8) == 1 and "not measured here" in fp8[0] and "Transformer Engine" in fp8[0]
    assert any("FP8/FP4 saved activations" in a for a in res.coverage["approximated"])
    footer = res.md.strip().splitlines()[-1]
    assert footer.startswith("_Modelled for this config: ") and "FP8 (tensorwise" in footer


def test_fp8_with_local_layers_is_a_warning_and_changes_nothing(tmp_path, cli):
    plain = cli(_yaml(tmp_path, system={"transformer_impl": "local"}))
    res = cli(_yaml(tmp_path, system={"fp8": "hybrid", "transformer_impl": "local"}))
    line = [x for x in res.warnings() if "fp8 with transformer_impl local" in x]
    assert len(line) == 1 and "activation dtype" in line[0]
    assert res.report["ranks"] == plain.report["ranks"]
    assert not any(m.startswith("FP8") for m in res.coverage["modelled"])


def test_tp_comm_overlap_is_read_not_warned(tmp_path, cli):
    res = cli(_yaml(tmp_path, system={"tp_comm_overlap": True}))
    assert not any("tp_comm_overlap" in x for x in res.warnings())
    assert _keys(res) == [] and "tp_comm_overlap" not in res.coverage["unused_keys"]


def test_cuda_graphs_are_a_not_modelled_warning(tmp_path, cli):
    res = cli(_yaml(tmp_path, system={"cuda_graph_impl": "local"}))
    assert any("cuda_graph_impl=local is not modelled: " in x for x in res.warnings())
    assert _keys(res) == ["cuda_graph_impl"]
    assert "private memory pool" in res.coverage["not_modelled"][0]["reason"]


def test_default_values_are_not_reported(tmp_path, cli):
    defaults = {
        "fp8": None,
        "tp_comm_overlap": False,
        "cuda_graph_impl": "none",
        "data_parallel_sharding_strategy": "no_shard",
        "main_grads_dtype": "fp32",
        "exp_avg_dtype": "float32",
        "moe_token_dispatcher_type": "allgather",
        "recompute_modules": [],
        "fp8_recipe": "tensorwise",  # without fp8 it does nothing
    }
    res = cli(_yaml(tmp_path, system=defaults))
    assert _keys(res) == [] and not any("not modelled" in x for x in res.warnings())
    # the estimator reads these
    read = {"fp8", "fp8_recipe", "moe_token_dispatcher_type", "main_grads_dtype",
            "exp_avg_dtype", "recompute_modules", "data_parallel_sharding_strategy",
            "tp_comm_overlap", "cuda_graph_impl"}  # fmt: skip
    assert set(defaults) - read <= set(res.coverage["unused_keys"])


def test_no_world_size_states_the_dp_assumed(tmp_path, cli):
    config = str(tmp_path / "tp2pp2.json")
    with open(TINY_JSON) as f:
        data = json.load(f)
    del data["train"]["dp"]
    data["train"].update(tp=2, pp=2)
    with open(config, "w") as f:
        json.dump(data, f)
    res = cli(config)
    assumed = [a for a in res.coverage["assumptions"] if "world size" in a]
    assert assumed == [
        "world size not given: data-parallel size 1 assumed (the least the grid allows), "
        "world size 4"
    ]
    assert "memscope: assumed: " in res.err and "data-parallel size 1 assumed" in res.err
    res = cli(config, "--world-size", "8")
    assert not any("data-parallel size" in a and "assumed" in a
                   for a in res.coverage["assumptions"])  # fmt: skip
    assert "world size 8 (from --world-size), data-parallel size 2" in res.coverage["assumptions"]


def test_flash_and_unfused_attention_assumptions(tmp_path, cli):
    res = cli(_yaml(tmp_path))
    attention = [a for a in res.coverage["assumptions"] if a.startswith("attention:")]
    assert len(attention) == 1 and "unfused" in attention[0] and "[b, a, s, s]" in attention[0]
    assert "unfused attention" in res.coverage["modelled"]
    res = cli(_yaml(tmp_path, system={"transformer_impl": "transformer_engine"}))
    attention = [a for a in res.coverage["assumptions"] if a.startswith("attention:")]
    assert len(attention) == 1 and "flash/fused kernel" in attention[0]
    assert "Transformer Engine layers" in attention[0]
    assert {"flash attention", "Transformer Engine layers"} <= set(res.coverage["modelled"])
    assert "unfused attention" not in res.coverage["modelled"]


def test_gpu_and_device_assumptions(tmp_path, cli):
    res = cli(_yaml(tmp_path))
    assert any(a.startswith("device: cuda, GPU H100 assumed") for a in res.coverage["assumptions"])
    assert cov.CUDA_ALLOWANCE in res.coverage["not_modelled_features"]
    res = cli(_yaml(tmp_path), "--device", "cpu")
    assert res.coverage["assumptions"][0].startswith("device: cpu")
    assert cov.CUDA_ALLOWANCE not in res.coverage["not_modelled_features"]


def test_json_aliases_dtype_and_model_type_are_read(tmp_path, cli):
    with open(TINY_JSON) as f:
        data = json.load(f)
    data["model"]["zzz_qqq"] = 1
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(data))
    res = cli(str(config))
    assert res.coverage["unused_keys"] == ["zzz_qqq"]  # tp, num_heads, dtype, model_type read
    assert "zzz_qqq" in res.md


def test_lora_keys_are_not_modelled(tmp_path, cli):
    res = cli(_yaml(tmp_path, model={"lora_rank": 16, "lora_alpha": 32}))
    assert _keys(res) == ["lora_alpha", "lora_rank"]
    assert "LoRA" in res.coverage["not_modelled"][0]["reason"]
    lines = [x for x in res.warnings() if "not modelled" in x]  # one line for a shared reason
    assert len(lines) == 1 and "lora_alpha=32, lora_rank=16 are not modelled: LoRA/PEFT" in lines[0]
    assert "lora_alpha, lora_rank" in res.coverage["not_modelled_features"]


# ---------------------------------------------------------------------------------------------
# The functions


def _spec(**args: Any):
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                vocab_size=128)  # fmt: skip
    return spec_from_megatron_args({**base, **args})


def test_a_key_the_estimator_reads_is_never_unused_or_not_modelled(monkeypatch):
    merged = {key: True for key in READ_KEYS} | {"not_a_megatron_key": 1}
    monkeypatch.setitem(cov.NOT_MODELLED, "swiglu", "pretend it is not modelled")
    result = config_coverage(merged, _spec(), None)
    assert result.unused_keys == ("not_a_megatron_key",)
    assert "swiglu" not in [n.key for n in result.not_modelled]


def test_shared_expert_overlap_is_read_and_routing_imbalance_is_a_stated_assumption():
    merged = {"moe_shared_expert_overlap": True}
    assert config_coverage(merged, _spec(), None).not_modelled == ()
    moe = _spec(num_experts=4, moe_router_topk=2, expert_model_parallel_size=2,
                data_parallel_size=2)  # fmt: skip
    result = config_coverage(merged, moe, None)
    assert result.not_modelled == ()  # modelled (moe.py), no longer listed
    assert any("MoE (4 experts, top-2" in m for m in result.modelled)
    [line] = [a for a in result.approximated if "moe_token_imbalance" in a]
    assert "1 (balanced)" in line and "bound 2" in line, line


def test_is_set():
    for key, value in (
        ("fp8", "hybrid"),
        ("tp_comm_overlap", True),
        ("cpu_offloading", 1),
        ("recompute_modules", ["mlp"]),
        ("moe_expert_capacity_factor", 1.0),
    ):
        assert is_set(key, value), (key, value)  # fmt: skip
    for key, value in (
        ("fp8", None),
        ("tp_comm_overlap", "false"),
        ("cpu_offloading", 0),
        ("recompute_modules", ["core_attn"]),
        ("main_params_dtype", "fp32"),
        ("moe_expert_capacity_factor", -1.0),
        ("fp8_recipe", "delayed"),
    ):
        assert not is_set(key, value), (key, value)  # fmt: skip


def test_load_config_gives_the_yaml_sections_merged_before_defaults(tmp_path):
    path = _yaml(tmp_path, model={"my_custom_knob": 3}, system={"tensor-model-parallel-size": 1})
    with open(path) as f:
        config = yaml.safe_load(f)
    spec, keys = load_config(path)
    expected = {
        key.replace("-", "_"): value
        for section in ("system", "model", "data")
        for key, value in _flat(config.get(section) or {}).items()
    }
    assert keys == expected and keys["my_custom_knob"] == 3
    assert "tensor_model_parallel_size" in keys and "tensor-model-parallel-size" not in keys
    assert "group_query_attention" not in keys  # a default megatron_defaults fills in
    assert spec == load_config_file(path)


def test_load_config_gives_json_keys_under_megatron_names(tmp_path):
    spec, keys = load_config(JSON_CONFIG)
    assert keys["num_attention_heads"] == spec.model.num_attention_heads  # alias num_heads
    assert "num_heads" not in keys and keys["dtype"] == "bf16"  # dtype as given


def _flat(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        out.update(_flat(value) if isinstance(value, dict) else {key: value})
    return out


def test_report_without_coverage_keeps_the_fixed_footer(tmp_path, cli):
    report = cli(_yaml(tmp_path)).report
    assert "Modelled for this config" in render_static_markdown(report)
    old = {k: v for k, v in report.items() if k != "coverage"}
    md = render_static_markdown(old)
    assert "Exact vs approximate" in md and "Assumptions and coverage" not in md


def test_selective_recompute_modules_and_features(tmp_path, cli):
    system = {"recompute_granularity": "selective", "recompute_modules": ["core_attn", "mlp"],
              "sequence_parallel": True, "tensor_model_parallel_size": 2,
              "use_distributed_optimizer": True}  # fmt: skip
    res = cli(_yaml(tmp_path, system=system), "--world-size", "4")
    assert _keys(res) == []  # recompute_modules is modelled now
    modelled = res.coverage["modelled"]
    for feature in ("selective recompute (core_attn, mlp)", "sequence parallel",
                    "distributed optimizer", "tensor parallel (tp=2)"):  # fmt: skip
        assert feature in modelled, modelled
    spec = replace(_spec(), recompute=None)
    assert config_coverage({"recompute_modules": ["mlp"]}, spec, None).not_modelled == ()


def test_precision_aware_optimizer_and_offloads_are_modelled_not_warned(tmp_path, cli):
    system = {"use_distributed_optimizer": True, "use_precision_aware_optimizer": True,
              "main_grads_dtype": "bf16", "exp_avg_dtype": "bf16", "optimizer_cpu_offload": True,
              "optimizer_offload_fraction": 0.5, "cpu_offloading": True,
              "cpu_offloading_num_layers": 1}  # fmt: skip
    res = cli(_yaml(tmp_path, system=system), "--world-size", "2")
    assert _keys(res) == []
    modelled = " | ".join(res.coverage["modelled"])
    assert "precision-aware optimizer (modelled from source, not measured" in modelled
    assert "optimizer CPU offload (fraction 0.5" in modelled
    assert "activation CPU offload (1 layers" in modelled
    assumed = " | ".join(res.coverage["assumptions"])
    assert "bf16 gradient buffer" in assumed or "bfloat16 gradient buffer" in assumed, assumed
