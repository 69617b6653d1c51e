"""RuntimeConfig: validation errors name the setting; ignored settings warn."""

import argparse

import pytest

from memscope.config import RuntimeConfig


def test_from_args_accepts_the_original_flag_set_only():
    # A namespace from the original provider (no step window, no backend flag).
    ns = argparse.Namespace(memscope=True, memscope_outdir="o", memscope_top_k=5)
    cfg = RuntimeConfig.from_megatron_args(ns)
    assert cfg.enabled and cfg.outdir == "o" and cfg.top_k == 5 and cfg.backend == "auto"


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"backend": "tpu"}, "backend"),
        ({"top_k": 0}, "top_k"),
        ({"step_start": 5, "step_end": 3}, "step_end"),
        ({"snapshot_stacks": "cpp"}, "snapshot_stacks"),
    ],
)
def test_invalid_settings_raise_value_error_naming_them(change, needle):
    with pytest.raises(ValueError, match=needle):
        RuntimeConfig(**change).validate()


def test_step_window_and_ranks():
    cfg = RuntimeConfig(step_start=2, step_end=4, ranks=[1])
    assert [cfg.in_step_window(s) for s in range(6)] == [False, False, True, True, False, False]
    assert cfg.traces_rank(1) and not cfg.traces_rank(0)


def test_ignored_settings_warn():
    cfg = RuntimeConfig(enable_memory_snapshot=True, sync_on_module_hooks=True, hook_modules=False)
    with pytest.warns(UserWarning) as record:
        notes = cfg.warn_ignored(cuda_available=False, backend="storage")
    assert len(notes) == 3 and len(record) == 3
    assert any("snapshot" in n for n in notes)
