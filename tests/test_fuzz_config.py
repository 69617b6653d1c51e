"""Property-based fuzzing of the config reader and ``memscope analyze-static``: whatever the
file holds (arbitrary JSON, mutations of the shipped configs, arbitrary YAML text), the
command ends with exit 0 or 2, no traceback, at most one error line -- and never through the
reader's safety net (which would mean a check is missing)."""

from __future__ import annotations

import glob
import json
import math
import os
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memscope.cli import main
from memscope.inputs.config_files import UNEXPECTED

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(REPO, "configs", "static", "*.json")))
SETTINGS = dict(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.integers()
    | st.sampled_from([2**31, 2**63, 2**64, 10**30, -(2**63), 10**12])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["bf16", "fp32", "${oc.env:X}", "1e3", "full", "selective", "[1]*4"])
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _run(capsys: pytest.CaptureFixture[str], path: str, outdir: str) -> None:
    rc = main(["analyze-static", "--config", path, "--outdir", outdir])
    out, err = capsys.readouterr()
    assert rc in (0, 2), (rc, err)
    assert "Traceback" not in err and UNEXPECTED not in err, err
    errors = [line for line in err.splitlines() if ": error: " in line]
    if rc == 2:
        assert len(errors) == 1 and len(err.strip().splitlines()) == 1, err
    else:
        assert not errors and out.startswith("peak "), err
        assert all(line.startswith("memscope") for line in err.splitlines()), err


def _write(directory: str, name: str, text: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


@settings(max_examples=150, **SETTINGS)
@given(doc=_values)
def test_arbitrary_json_documents(capsys, doc):
    with tempfile.TemporaryDirectory() as tmp:
        text = json.dumps(doc, allow_nan=True)
        _run(capsys, _write(tmp, "c.json", text), os.path.join(tmp, "out"))


def _mutation() -> st.SearchStrategy[tuple[str, Any]]:
    return st.tuples(st.sampled_from(["set", "delete"]), _values)


@settings(max_examples=300, **SETTINGS)
@given(
    base=st.sampled_from(CONFIGS),
    picks=st.lists(st.tuples(st.integers(0, 10**6), _mutation()), min_size=1, max_size=3),
)
def test_mutated_shipped_configs(capsys, base, picks):
    with open(base, encoding="utf-8") as f:
        config = json.load(f)
    slots = [(section, key) for section in sorted(config) for key in sorted(config[section])]
    for index, (action, value) in picks:
        section, key = slots[index % len(slots)]
        if action == "delete":
            config[section].pop(key, None)
        else:
            config[section][key] = value
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, "c.json", json.dumps(config, allow_nan=True))
        _run(capsys, path, os.path.join(tmp, "out"))


_YAML_KEYS = st.sampled_from(
    ["num_layers", "hidden_size", "num_attention_heads", "seq_length", "tensor_model_parallel_size",
     "pipeline_model_parallel_size", "micro_batch_size", "global_batch_size", "swiglu",
     "num_experts", "moe_layer_freq", "enable_hetero", "hetero_process_meshes", "multiple_of",
     "hidden_dim_multiplier", "num_query_groups", "group_query_attention", "vocab_size",
     "hetero_pipeline_layer_split", "optimizer", "recompute_granularity", "x", "hiden_size"]
)  # fmt: skip


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ("-.inf" if value < 0 else ".inf")
    return json.dumps(value, allow_nan=True)


@settings(max_examples=150, **SETTINGS)
@given(
    entries=st.dictionaries(_YAML_KEYS, _values, max_size=8),
    raw=st.text(alphabet=st.sampled_from(list(" :-[]{}&*!|>'\"#\n\tab01.,?%@`")), max_size=60),
    use_raw=st.booleans(),
)
def test_arbitrary_yaml_text(capsys, entries, raw, use_raw):
    base = ("model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n"
            "  seq_length: 32\n  vocab_size: 1000\n")  # fmt: skip
    body = "".join(f"  {k}: {_yaml_scalar(v)}\n" for k, v in entries.items())
    text = raw if use_raw else "system:\n  micro_batch_size: 1\n" + base + body
    with tempfile.TemporaryDirectory() as tmp:
        _run(capsys, _write(tmp, "c.yaml", text), os.path.join(tmp, "out"))
