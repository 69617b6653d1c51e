"""Global layer numbers next to stage-local module names (reporters/layer_labels.py)."""

from __future__ import annotations

import copy

from memscope.reporters.html_payload import runtime_payload
from memscope.reporters.layer_labels import label_modules, layer_labeler
from memscope.reporters.markdown import render_runtime_markdown

NUMBERS = {"decoder.layers.0": 3, "decoder.layers.1": 4, "chunk1.decoder.layers.0": 7}


def test_a_module_is_labelled_by_the_layer_that_holds_it_and_no_other():
    label = layer_labeler(NUMBERS)
    assert label("decoder.layers.1.mlp.linear_fc1") == "decoder.layers.1.mlp.linear_fc1 (layer 4)"
    assert label("decoder.layers.0") == "decoder.layers.0 (layer 3)"
    assert label("chunk1.decoder.layers.0.self_attention") == (
        "chunk1.decoder.layers.0.self_attention (layer 7)"
    )
    # a prefix by characters is not a prefix by module path
    assert label("decoder.layers.10.mlp") == "decoder.layers.10.mlp"
    assert label("embedding") == "embedding" and label("decoder") == "decoder"
    assert layer_labeler(None)("decoder.layers.0") == "decoder.layers.0"


def test_every_module_field_is_labelled_except_raw_events_and_the_input_is_kept():
    report = {
        "metadata": {"layer_numbers": NUMBERS},
        "peak": {"module": "decoder.layers.0.mlp", "composition": {"items": [
            {"module": "decoder.layers.1.mlp"}, {"module": None}]}},
        "within": {"module": ["decoder.layers.0", "", None, "output_layer"]},
        "runtime_trace": [{"module": "decoder.layers.0.mlp"}],
    }  # fmt: skip
    before = copy.deepcopy(report)
    out = label_modules(report, NUMBERS)
    assert report == before
    assert out["peak"]["module"] == "decoder.layers.0.mlp (layer 3)"
    assert out["peak"]["composition"]["items"][0]["module"] == "decoder.layers.1.mlp (layer 4)"
    assert out["peak"]["composition"]["items"][1]["module"] is None
    assert out["within"]["module"] == ["decoder.layers.0 (layer 3)", "", None, "output_layer"]
    assert out["runtime_trace"] == before["runtime_trace"]
    assert label_modules(report, {}) is report


def _report(numbers: dict[str, int] | None) -> dict:
    meta = {"backend": "storage", "backend_info": {"device_type": "cpu"}}
    if numbers:
        meta["layer_numbers"] = numbers
    peak = {"module": "decoder.layers.1.mlp", "phase": "backward", "step": 1}
    row = {"event_type": "module_forward", "module": "decoder.layers.1.mlp", "phase": "backward",
           "count": 1, "mem_allocated_after": 10, "max_delta_allocated": 4,
           "min_delta_allocated": -4, "worst_step": 1, "leaf": False}  # fmt: skip
    modules = [
        {
            "module": "decoder.layers.1.mlp",
            "module_class": "MLP",
            "count": 1,
            "max_allocated_after": 10,
            "max_delta_allocated": 4,
            "min_delta_allocated": -4,
        }
    ]
    return {"rank": 1, "world_size": 2, "metadata": meta, "peak": peak, "top_events": [row],
            "module_summary": modules}  # fmt: skip


def test_markdown_and_page_show_the_same_label_and_keep_the_peak_row():
    md = render_runtime_markdown(_report(NUMBERS))
    assert "decoder.layers.1.mlp (layer 4)" in md
    assert "(layer" not in render_runtime_markdown(_report(None))
    payload = runtime_payload(_report(NUMBERS))
    assert payload["peak"]["module"] == "decoder.layers.1.mlp (layer 4)"
    assert payload["module_summary"][0]["module"] == "decoder.layers.1.mlp (layer 4)"
    (row,) = payload["top_events"]
    assert row["module"] == "decoder.layers.1.mlp (layer 4)" and row["is_peak"] is True
