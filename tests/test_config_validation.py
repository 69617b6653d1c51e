"""A config is validated before the static estimator runs: every refusal is one line naming
the field (exit code 2), every suspicious value one warning line (the estimate is still made),
and nothing in the file -- alias bombs, FIFOs, huge numbers -- gets past as a traceback."""

from __future__ import annotations

import contextlib
import copy
import glob
import json
import os
import warnings
from typing import Any, ClassVar

import pytest

from memscope.analysis.static.read_keys import READ_KEYS
from memscope.analysis.static.validation import ConfigWarning
from memscope.cli import main
from memscope.inputs.config_files import load_config_file
from memscope.inputs.config_text import MAX_CONFIG_BYTES, MAX_YAML_ALIASES
from memscope.inputs.megatron_args import spec_from_megatron_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "configs", "static", "tiny_gpt.json")


def _cli(capsys, tmp_path, path, *extra):
    rc = main(["analyze-static", "--config", str(path), "--outdir", str(tmp_path / "out"), *extra])
    return rc, capsys.readouterr().err


def _json(tmp_path, changes: dict[str, dict[str, Any]], drop: tuple[str, ...] = ()) -> str:
    with open(TINY, encoding="utf-8") as f:
        config = json.load(f)
    for section, values in changes.items():
        config.setdefault(section, {}).update(values)
    for key in drop:
        for section in config.values():
            section.pop(key, None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


REFUSED = [
    # batch: global batch vs micro batch x data parallel (megatron-core's microbatch calculator)
    (
        "gbs_not_multiple",
        {"train": {"global_batch_size": 7}},
        "training.global_batch_size (7) must be a multiple of micro_batch_size x parallel.dp",
    ),
    (
        "gbs_below_mbs_dp",
        {"train": {"global_batch_size": 2, "dp": 2}},
        "must be a multiple of micro_batch_size x parallel.dp (2 x 2)",
    ),
    ("gbs_zero", {"train": {"global_batch_size": 0}}, "training.global_batch_size must be >= 1"),
    ("mbs_zero", {"train": {"batch_size": 0}}, "training.micro_batch_size must be >= 1, got 0"),
    (
        "microbatches_zero",
        {"train": {"num_microbatches": 0, "global_batch_size": None}},
        "training.num_microbatches must be >= 1",
    ),
    # world size vs tp x pp x cp (x dp) -- megatron/core/parallel_state.py
    ("world_not_tp_pp_cp_dp", {"train": {"world_size": 3}}, "parallel.world_size (world_size) 3"),
    (
        "world_not_multiple",
        {"train": {"world_size": 6, "dp": None, "tp": 4}},
        "is not a multiple of tp x pp x cp (4 x 1 x 1)",
    ),
    (
        "ep_not_dividing_dp_cp",
        {
            "model": {"num_experts": 4},
            "train": {"expert_model_parallel_size": 4, "dp": 2, "global_batch_size": 8},
        },
        "parallel.ep x etp (4 x 1) must divide parallel.tp x cp x dp",
    ),
    # zero or negative sizes
    ("layers_zero", {"model": {"num_layers": 0}}, "model.num_layers must be positive, got 0"),
    ("hidden_negative", {"model": {"hidden_size": -256}}, "model.hidden_size must be positive"),
    ("heads_zero", {"model": {"num_heads": 0}}, "model.num_attention_heads must be positive"),
    ("seq_zero", {"model": {"seq_len": 0}}, "model.seq_length must be positive, got 0"),
    ("vocab_negative", {"model": {"vocab_size": -5}}, "model.vocab_size must be positive"),
    ("ffn_zero", {"model": {"intermediate_size": 0}}, "model.ffn_hidden_size must be positive"),
    ("kv_channels_zero", {"model": {"kv_channels": 0}}, "model.kv_channels must be positive"),
    (
        "query_groups_zero",
        {"model": {"num_kv_heads": 0}},
        "model.num_query_groups must be positive",
    ),
    ("experts_zero", {"model": {"num_experts": 0}}, "model.num_experts must be >= 1, got 0"),
    (
        "topk_zero",
        {"model": {"num_experts": 4, "moe_router_topk": 0, "disable_bias_linear": True}},
        "model.moe_router_topk must be >= 1, got 0",
    ),
    ("tp_zero", {"train": {"tp": 0}}, "parallel.tp (tensor_model_parallel_size) must be >= 1"),
    (
        "pp_negative",
        {"train": {"pp": -2}},
        "parallel.pp (pipeline_model_parallel_size) must be >= 1",
    ),
    ("cp_zero", {"train": {"context_parallel_size": 0}}, "parallel.cp (context_parallel_size)"),
    ("etp_zero", {"train": {"expert_tensor_parallel_size": 0}}, "parallel.etp"),
    ("vpp_zero", {"train": {"vpp": 0, "pp": 2}}, "parallel.vpp must be >= 1, got 0"),
    (
        "divisible_by_zero",
        {"model": {"make_vocab_size_divisible_by": 0}},
        "make_vocab_size_divisible_by must be >= 1",
    ),
    # widths
    (
        "ffn_not_sharded",
        {"model": {"intermediate_size": 1001}, "train": {"tp": 2}},
        "parallel.tp (2) must divide model.ffn_hidden_size (1001)",
    ),
    (
        "groups_not_dividing_heads",
        {"model": {"num_kv_heads": 3}},
        "model.num_query_groups (3) must divide model.num_attention_heads (8)",
    ),
    (
        "heads_not_dividing_hidden",
        {"model": {"num_heads": 7}},
        "model.num_attention_heads (7) must divide model.hidden_size (256)",
    ),
    (
        "seq_not_split_by_cp",
        {"model": {"seq_len": 510}, "train": {"context_parallel_size": 2}},
        "model.seq_length (510) must be a multiple of 2 x parallel.cp (4)",
    ),
    # probabilities and factors
    (
        "dropout_above_one",
        {"model": {"hidden_dropout": 1.5}},
        "model.hidden_dropout must be in [0, 1], got 1.5",
    ),
    (
        "dropout_negative",
        {"model": {"attention_dropout": -0.1}},
        "model.attention_dropout must be in [0, 1]",
    ),
    (
        "dropout_nan",
        {"model": {"hidden_dropout": float("nan")}},
        "model.hidden_dropout: expected a finite number, got nan",
    ),
    (
        "capacity_zero",
        {"model": {"num_experts": 2, "moe_expert_capacity_factor": 0, "disable_bias_linear": True}},
        "moe_expert_capacity_factor must be > 0",
    ),
    (
        "aux_loss_negative",
        {"model": {"num_experts": 2, "moe_aux_loss_coeff": -1, "disable_bias_linear": True}},
        "moe_aux_loss_coeff must be in >= 0",
    ),
    (
        "sgd_momentum_inf",
        {"train": {"sgd_momentum": float("inf")}},
        "sgd_momentum: expected a finite number",
    ),
    # wrong types
    (
        "string_for_int",
        {"model": {"hidden_size": "big"}},
        "model.hidden_size: expected an integer, got 'big'",
    ),
    (
        "float_for_int",
        {"model": {"num_layers": 4.5}},
        "model.num_layers: expected an integer, got 4.5",
    ),
    (
        "bool_for_int",
        {"model": {"num_layers": True}},
        "model.num_layers: expected an integer, got True",
    ),
    (
        "list_for_int",
        {"train": {"tp": [1, 2]}},
        "parallel.tp (tensor_model_parallel_size): expected an integer, got a list",
    ),
    (
        "dict_for_int",
        {"model": {"hidden_size": {"value": 256}}},
        "hidden_size: expected a value, got a mapping",
    ),
    (
        "string_for_flag",
        {"train": {"sequence_parallel": "maybe"}},
        "sequence_parallel: expected true or false, got 'maybe'",
    ),
    (
        "number_for_name",
        {"train": {"optimizer": 3}},
        "optimizer: expected a name (a string), got 3",
    ),
    (
        "list_for_dtype",
        {"train": {"dtype": ["bf16"]}},
        "dtype: expected a name (a string), got a list",
    ),
    (
        "string_for_dropout",
        {"model": {"hidden_dropout": "none"}},
        "model.hidden_dropout: expected a number, got 'none'",
    ),
    (
        "int64_overflow",
        {"model": {"hidden_size": 2**70}},
        "model.hidden_size: 1180591620717411303424 does not fit a 64-bit integer",
    ),
    # beyond what the estimator lists
    (
        "layers_beyond_limit",
        {"model": {"num_layers": 100_000}},
        "model.num_layers (100000) is beyond the 4096 layers",
    ),
    (
        "world_beyond_limit",
        {"train": {"dp": 2**30, "global_batch_size": None}},
        "world size 1073741824 (tp x pp x cp x dp) is beyond",
    ),
]


@pytest.mark.parametrize(("case", "change", "needle"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_with_one_line_naming_the_field(tmp_path, capsys, case, change, needle):
    path = _json(tmp_path, change)
    rc, err = _cli(capsys, tmp_path, path)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert needle in lines[0] and "Traceback" not in err, lines[0]
    assert not (tmp_path / "out").exists()


def test_list_where_a_section_belongs_names_the_section(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": [1, 2], "train": {}}))
    rc, err = _cli(capsys, tmp_path, path)
    assert rc == 2 and "model: expected a mapping, got a list" in err


def test_missing_required_field_is_named(tmp_path, capsys):
    rc, err = _cli(capsys, tmp_path, _json(tmp_path, {}, drop=("num_layers",)))
    assert rc == 2 and "model.num_layers is required" in err


# ---------------------------------------------------------------------------------------------
# Warnings: one line each, the estimate is still made


def test_misspelled_json_key_warns_with_the_nearest_known_key(tmp_path, capsys):
    path = _json(tmp_path, {"model": {"hiden_size": 512}, "train": {"sequence_paralel": True}})
    rc, err = _cli(capsys, tmp_path, path)
    assert rc == 0, err
    warnings_ = [line for line in err.splitlines() if ": warning: " in line]
    assert len(warnings_) == 2
    assert "'hiden_size'" in warnings_[0] and "did you mean 'hidden_size'?" in warnings_[0]
    assert "did you mean 'sequence_parallel'?" in warnings_[1]
    report = json.loads((tmp_path / "out" / "static_report.json").read_text())
    assert len(report["warnings"]) == 2


def test_unknown_json_key_without_a_near_one_still_warns(tmp_path, capsys):
    rc, err = _cli(capsys, tmp_path, _json(tmp_path, {"model": {"zzz_qqq": 1}}))
    assert rc == 0 and "'zzz_qqq' is not read by the static estimator (ignored)" in err
    assert "did you mean" not in err


def test_absurd_sizes_warn_with_the_reason(tmp_path, capsys):
    path = _json(tmp_path, {"model": {"hidden_size": 10**12}})
    rc, err = _cli(capsys, tmp_path, path)
    assert rc == 0, err
    lines = err.strip().splitlines()
    assert any("model.hidden_size (1,000,000,000,000) is larger than any real model" in x
               for x in lines)  # fmt: skip
    assert any("PiB, beyond any accelerator's memory" in x for x in lines)
    assert all(x.startswith("memscope") for x in lines)  # one line each


def test_the_shipped_configs_give_no_warning(tmp_path, capsys):
    for path in sorted(glob.glob(os.path.join(REPO, "configs", "static", "*.json"))):
        rc, err = _cli(capsys, tmp_path, path)
        assert rc == 0 and "warning" not in err, (path, err)


def test_every_key_the_reader_reads_is_a_known_key():
    """Recording every ``get`` of the reader: no key it reads may be reported as unknown."""

    class Recording(dict):  # type: ignore[type-arg]
        seen: ClassVar[set[str]] = set()

        def get(self, key: Any, default: Any = None) -> Any:
            self.seen.add(key)
            return super().get(key, default)

    args = Recording(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16,
                     vocab_size=128, num_experts=4, disable_bias_linear=True,
                     multi_latent_attention=True, num_layers_per_virtual_pipeline_stage=1,
                     pipeline_model_parallel_size=2, world_size=8)  # fmt: skip
    spec_from_megatron_args(args)
    internal = {"hetero_stage_layers", "hetero_stage_meshes"}
    assert Recording.seen - internal <= READ_KEYS, Recording.seen - internal - READ_KEYS


def _yaml_text(model: str = "", system: str = "") -> str:
    return (
        "system:\n  tensor_model_parallel_size: 1\n" + system
        + "model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n"
        "  seq_length: 32\n  micro_batch_size: 1\n  global_batch_size: 4\n" + model
        + "data:\n  tokenizer:\n    vocab_size: 1000\n"
    )  # fmt: skip


def test_yaml_typo_near_a_key_we_read_warns_but_megatron_keys_do_not(tmp_path, capsys):
    path = tmp_path / "t.yaml"
    extra = "  sequence_paralel: true\n  moe_z_loss_coeff: 0.1\n  lr: 0.1\n  train_iters: 10\n"
    path.write_text(_yaml_text(extra + "  ffn_hiden_size: 256\n"))
    rc, err = _cli(capsys, tmp_path, path)
    assert rc == 0, err
    lines = [x for x in err.splitlines() if ": warning: " in x]
    assert len(lines) == 2, err
    assert "did you mean 'sequence_parallel'" in lines[0]
    assert "did you mean 'ffn_hidden_size'" in lines[1]


@pytest.mark.integration  # reads the FlagScale tree's example YAMLs
def test_flagscale_example_yamls_give_no_warning():
    import sys

    sys.path.insert(0, os.path.join(REPO, "tools"))
    from flagscale_wheel import flagscale_tree

    try:
        tree = flagscale_tree(download=False)
    except RuntimeError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"FlagScale wheel unavailable: {exc}")
    paths = sorted(glob.glob(os.path.join(tree, "examples", "*", "conf", "train", "*.yaml")))
    paths += sorted(glob.glob(os.path.join(REPO, "configs", "flagscale", "train", "*.yaml")))
    assert len(paths) >= 36
    for path in paths:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConfigWarning)
            with contextlib.suppress(ValueError):  # non-GPT examples: test_static_moe_mla.py
                load_config_file(path, vocab_size=151851)
        assert not [w for w in caught if issubclass(w.category, ConfigWarning)], path


# ---------------------------------------------------------------------------------------------
# YAML and file safety


def test_yaml_billion_laughs_is_refused_in_one_line(tmp_path, capsys):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    path = tmp_path / "bomb.yaml"
    path.write_text(_yaml_text() + "\n".join(lines) + "\n")
    rc, err = _cli(capsys, tmp_path, path)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"more than {MAX_YAML_ALIASES} aliases" in err


def test_yaml_alias_expansion_is_bounded_below_the_alias_count(tmp_path, capsys):
    # 30 aliases, but each doubles a list of 5,000 strings -> far beyond 100,000 values
    lines = ["b0: &b0 [" + ", ".join(["x"] * 5000) + "]"]
    lines += [f"b{i}: &b{i} [*b{i - 1}, *b{i - 1}]" for i in range(1, 16)]
    path = tmp_path / "wide.yaml"
    path.write_text(_yaml_text() + "\n".join(lines) + "\n")
    rc, err = _cli(capsys, tmp_path, path)
    assert rc == 2 and "values once its aliases are expanded" in err, err


def test_yaml_recursive_alias_is_refused(tmp_path, capsys):
    path = tmp_path / "loop.yaml"
    path.write_text(_yaml_text() + "loop: &loop [*loop]\n")
    rc, err = _cli(capsys, tmp_path, path)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("key", ["1", "null", "true", "[1, 2]", "2024-01-01"])
def test_yaml_non_string_keys_are_refused(tmp_path, capsys, key):
    path = tmp_path / "keys.yaml"
    path.write_text(_yaml_text(f"  ? {key}\n  : 3\n"))
    rc, err = _cli(capsys, tmp_path, path)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "is not a string" in err or "invalid YAML" in err


def test_non_regular_files_are_refused_before_reading(tmp_path, capsys):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    rc, err = _cli(capsys, tmp_path, fifo)  # would block forever if opened for reading
    assert rc == 2 and "is a FIFO, expected a regular file" in err
    if os.path.exists("/dev/zero"):
        rc, err = _cli(capsys, tmp_path, "/dev/zero")
        assert rc == 2 and "expected a regular file" in err
    rc, err = _cli(capsys, tmp_path, tmp_path)
    assert rc == 2 and "is a directory" in err


def test_oversized_and_non_utf8_files_are_refused(tmp_path, capsys):
    big = tmp_path / "big.json"
    big.write_text(" " * (MAX_CONFIG_BYTES + 1))
    rc, err = _cli(capsys, tmp_path, big)
    assert rc == 2 and f"more than the {MAX_CONFIG_BYTES} allowed" in err
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"model: \xff\xfe\n")
    rc, err = _cli(capsys, tmp_path, binary)
    assert rc == 2 and "not UTF-8 text" in err


def test_deep_nesting_and_huge_numbers_are_one_line(tmp_path, capsys):
    cases = {
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "deep2.json": json.dumps({"model": copy.deepcopy({"a": {"b": {"c": {}}}})}).replace(
            "{}", '{"d": ' * 40 + "1" + "}" * 40
        ),
        "digits.json": '{"model": {"hidden_size": ' + "9" * 5000 + "}}",
        "digits.yaml": "model:\n  hidden_size: " + "9" * 5000 + "\n",
        "deep.yaml": "a: " + "[" * 5000 + "]" * 5000 + "\n",
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        rc, err = _cli(capsys, tmp_path, path)
        assert rc == 2 and len(err.strip().splitlines()) == 1, (name, err)
        assert "Traceback" not in err and "unexpected value" not in err, (name, err)
