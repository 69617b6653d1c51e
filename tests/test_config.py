"""RuntimeConfig: validation errors name the setting; ignored settings warn."""

import argparse
import ast
import dataclasses
import json

import pytest

import memscope.capture.backends  # noqa: F401 - the registry offers the valid backend names
from memscope.config import (
    SNAPSHOT_STACKS,
    ProfilerSchedule,
    RuntimeConfig,
    runtime_settings,
)


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
    assert len(notes) == 2 and len(record) == 2  # the storage ledger records the snapshot
    assert not any("snapshot" in n for n in notes)
    with pytest.warns(UserWarning, match="memory snapshot needs CUDA"):
        notes = cfg.warn_ignored(cuda_available=False, backend="cuda")
    assert any("snapshot" in n for n in notes)


def test_config_imports_no_other_memscope_module():
    """config sits below every layer: it may import only ``memscope._version``."""
    import memscope.config

    with open(memscope.config.__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import in memscope/config.py"
            imported.append(node.module or "")
    ours = {m for m in imported if m == "memscope" or m.startswith("memscope.")}
    assert ours <= {"memscope._version"}, ours


def test_snapshot_stack_choices_live_in_config_and_backend_names_in_the_registry():
    assert SNAPSHOT_STACKS == ("none", "python", "all")
    assert "backend" not in {s.name for s in runtime_settings() if s.choices is not None}


def test_every_field_is_a_setting_with_help():
    """Every field but ``notes`` (what reading the settings had to say) is a setting."""
    names = [s.name for s in runtime_settings()]
    assert names == [f.name for f in dataclasses.fields(RuntimeConfig) if f.name != "notes"]
    assert "notes" not in RuntimeConfig().to_report_dict()
    assert all(s.help for s in runtime_settings())


def test_report_dict_keeps_the_nested_schedule_schema():
    report = RuntimeConfig().to_report_dict()
    assert list(report) == [
        "enabled", "outdir", "top_k", "backend", "hook_modules", "hook_output_grads",
        "hook_param_grads", "sync_on_step_boundaries", "sync_on_module_hooks",
        "reset_peak_stats", "storage_capacity_mib", "job_summary", "job_summary_timeout",
        "dashboard_peaks", "ranks",
        "step_start", "step_end", "hook_steps", "detail_steps", "max_trace_events",
        "trace_jsonl", "trace_max_mib", "report_interval", "record_tensor_shapes",
        "enable_profiler", "profiler_ranks", "profiler_schedule", "enable_memory_snapshot",
        "snapshot_ranks", "snapshot_schedule", "snapshot_max_entries", "snapshot_stacks",
    ]  # fmt: skip
    assert report["profiler_schedule"] == {"wait": 1, "warmup": 1, "active": 2}
    assert report["snapshot_schedule"] == {"wait": 0, "warmup": 0, "active": 2}
    assert report["ranks"] is None and report["profiler_ranks"] == [0]
    json.dumps(report)  # plain data only
    cfg = RuntimeConfig(profiler_wait=3, snapshot_start_step=4, snapshot_steps=5, ranks=[1])
    report = cfg.to_report_dict()
    assert report["profiler_schedule"] == {"wait": 3, "warmup": 1, "active": 2}
    assert report["snapshot_schedule"] == {"wait": 4, "warmup": 0, "active": 5}
    report["ranks"].append(9)  # a copy, not the config's own list
    assert cfg.ranks == [1]


def test_schedules_are_views_of_the_flat_fields():
    cfg = RuntimeConfig(profiler_wait=0, profiler_warmup=2, profiler_active=3)
    assert cfg.profiler_schedule == ProfilerSchedule(wait=0, warmup=2, active=3)
    assert RuntimeConfig().snapshot_schedule == ProfilerSchedule(wait=0, warmup=0, active=2)
    with pytest.raises(ValueError, match="profiler schedule"):
        RuntimeConfig(profiler_active=0).validate()
    with pytest.raises(ValueError, match="snapshot schedule"):
        RuntimeConfig(snapshot_steps=0).validate()


def test_list_defaults_are_not_shared():
    a, b = RuntimeConfig(), RuntimeConfig()
    a.profiler_ranks.append(1)
    assert b.profiler_ranks == [0] and RuntimeConfig().profiler_ranks == [0]


def test_from_args_maps_a_negative_step_end_to_none_and_validates():
    ns = argparse.Namespace(memscope=True, memscope_step_end=-1, memscope_profiler_active=4)
    cfg = RuntimeConfig.from_megatron_args(ns)
    assert cfg.step_end is None and cfg.profiler_schedule.active == 4
    # an invalid setting never raises into training: its default, said once in the notes
    tpu = RuntimeConfig.from_megatron_args(argparse.Namespace(memscope_backend="tpu"))
    assert tpu.backend == RuntimeConfig().backend
    assert len(tpu.notes) == 1 and "backend" in tpu.notes[0] and "default" in tpu.notes[0]


@pytest.mark.parametrize(
    ("namespace", "setting", "default"),
    [({"memscope_trace_max_mib": -1}, "trace_max_mib", 1024),
     ({"memscope_top_k": "many"}, "top_k", 20),
     ({"memscope_top_k": 0}, "top_k", 20),
     ({"memscope_step_start": 5, "memscope_step_end": 3}, "step_end", None),
     ({"memscope_job_summary_timeout": float("nan")}, "job_summary_timeout", 60.0),
     ({"memscope_snapshot_steps": 0}, "snapshot_steps", 2),
     ({"memscope_ranks": "0,1"}, "ranks", None)],
)  # fmt: skip
def test_an_invalid_setting_from_args_takes_its_default_and_says_so(namespace, setting, default):
    cfg = RuntimeConfig.from_megatron_args(argparse.Namespace(memscope=True, **namespace))
    assert getattr(cfg, setting) == default and cfg.enabled
    assert len(cfg.notes) == 1 and setting in cfg.notes[0]
    assert cfg.validate() is cfg
