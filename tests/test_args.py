"""add_memscope_args: every switch settable on and off, FlagScale-style, and composition."""

import argparse
import dataclasses

import pytest

from memscope.config import SNAPSHOT_STACKS, RuntimeConfig, runtime_settings
from memscope.integrations.megatron import add_memscope_args, compose_args_providers, parse_bool

ORIGINAL_FLAGS = [
    "--memscope",
    "--memscope-outdir",
    "--memscope-top-k",
    "--memscope-hook-modules",
    "--memscope-hook-output-grads",
    "--memscope-hook-param-grads",
    "--memscope-enable-profiler",
    "--memscope-enable-memory-snapshot",
    "--memscope-profiler-ranks",
    "--memscope-snapshot-ranks",
    "--memscope-sync-on-step-boundaries",
    "--memscope-sync-on-module-hooks",
    "--memscope-backend",
]


def _parse(argv):
    return add_memscope_args(argparse.ArgumentParser(allow_abbrev=False)).parse_args(argv)


def _flatten_like_flagscale(system: dict) -> list[str]:
    """The FlagScale runner's documented rule: true -> --key, false -> dropped, list -> values."""
    out: list[str] = []
    for key, value in system.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                out.append(flag)
        elif isinstance(value, list):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def test_original_flags_are_all_registered():
    parser = add_memscope_args(argparse.ArgumentParser())
    known = {s for a in parser._actions for s in a.option_strings}
    missing = [f for f in ORIGINAL_FLAGS if f not in known]
    assert not missing


def test_defaults_are_off_for_memscope_and_on_for_hooks():
    args = _parse([])
    assert args.memscope is False
    assert args.memscope_hook_modules and args.memscope_hook_output_grads
    assert args.memscope_hook_param_grads
    assert args.memscope_sync_on_module_hooks is False


@pytest.mark.parametrize("off", ["false", "0", "off", "no", "False"])
def test_default_on_switch_can_be_turned_off_with_a_value(off):
    args = _parse(["--memscope", "--memscope-hook-modules", off])
    assert args.memscope is True
    assert args.memscope_hook_modules is False


def test_negative_switch_turns_off():
    assert _parse(["--memscope-no-hook-param-grads"]).memscope_hook_param_grads is False


def test_flagscale_yaml_can_switch_everything_on_and_off():
    system = {
        "memscope": True,
        "memscope_outdir": "/x/memscope",
        "memscope_top_k": 7,
        "memscope_hook_modules": "false",  # a quoted string survives the runner
        "memscope_hook_output_grads": 0,
        "memscope_hook_param_grads": True,
        "memscope_enable_profiler": True,
        "memscope_enable_memory_snapshot": False,  # dropped by the runner -> default off
        "memscope_profiler_ranks": [0, 3],
        "memscope_snapshot_ranks": [1],
        "memscope_sync_on_step_boundaries": "true",
        "memscope_backend": "storage",
    }
    args = _parse(_flatten_like_flagscale(system))
    cfg = RuntimeConfig.from_megatron_args(args)
    assert cfg.enabled and cfg.outdir == "/x/memscope" and cfg.top_k == 7
    assert cfg.hook_modules is False and cfg.hook_output_grads is False
    assert cfg.hook_param_grads is True
    assert cfg.enable_profiler is True and cfg.enable_memory_snapshot is False
    assert cfg.profiler_ranks == [0, 3] and cfg.snapshot_ranks == [1]
    assert cfg.sync_on_step_boundaries is True
    assert cfg.backend == "storage"


def test_bad_boolean_is_a_clear_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        _parse(["--memscope-hook-modules", "maybe"])
    assert exc.value.code == 2
    assert "expected a boolean" in capsys.readouterr().err


def test_compose_keeps_both_providers_arguments():
    def other(parser):
        parser.add_argument("--modelopt-thing", type=int, default=3)
        return parser

    def returns_none(parser):
        parser.add_argument("--legacy-flag", action="store_true")

    provider = compose_args_providers(add_memscope_args, None, other, returns_none)
    args = provider(argparse.ArgumentParser()).parse_args(["--memscope", "--legacy-flag"])
    assert args.memscope and args.modelopt_thing == 3 and args.legacy_flag


def test_parse_bool_rejects_garbage():
    assert parse_bool("ON") is True and parse_bool("n") is False
    with pytest.raises(argparse.ArgumentTypeError):
        parse_bool("2")


# -- one source of truth: the RuntimeConfig fields ----------------------------------------


def _visible_actions(parser):
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]


def test_every_setting_has_exactly_one_flag_with_the_field_default():
    parser = add_memscope_args(argparse.ArgumentParser())
    actions = [a for a in _visible_actions(parser) if a.dest != "help"]
    fields_with_help = [f for f in dataclasses.fields(RuntimeConfig) if "help" in f.metadata]
    assert fields_with_help and len(actions) == len(fields_with_help)
    defaults = RuntimeConfig()
    for f in fields_with_help:
        s = next(s for s in runtime_settings() if s.name == f.name)
        mine = [a for a in actions if a.dest == s.dest]
        assert len(mine) == 1, f.name
        (action,) = mine
        assert action.option_strings == [s.flag]
        assert s.from_cli(action.default) == getattr(defaults, f.name), f.name
        assert f.metadata["help"] in action.help
        assert action.choices == f.metadata["choices"]
    parsed = vars(parser.parse_args([]))
    assert parsed["memscope_step_end"] == -1  # the CLI spelling of "no end"
    assert parsed["memscope_ranks"] is None and parsed["memscope_profiler_ranks"] == [0]


def test_a_namespace_of_defaults_round_trips_to_the_default_config():
    assert RuntimeConfig.from_megatron_args(_parse([])) == RuntimeConfig()
    assert RuntimeConfig.from_megatron_args(argparse.Namespace()) == RuntimeConfig()


def test_every_option_round_trips_to_its_field():
    argv = [
        "--memscope", "--memscope-outdir", "d", "--memscope-top-k", "3",
        "--memscope-backend", "cuda", "--memscope-no-hook-modules",
        "--memscope-ranks", "0", "2", "--memscope-step-start", "1", "--memscope-step-end", "9",
        "--memscope-profiler-wait", "0", "--memscope-profiler-warmup", "2",
        "--memscope-profiler-active", "3", "--memscope-snapshot-start-step", "4",
        "--memscope-snapshot-steps", "5", "--memscope-snapshot-stacks", "all",
    ]  # fmt: skip
    cfg = RuntimeConfig.from_megatron_args(_parse(argv))
    assert cfg == RuntimeConfig(
        enabled=True, outdir="d", top_k=3, backend="cuda", hook_modules=False, ranks=[0, 2],
        step_start=1, step_end=9, profiler_wait=0, profiler_warmup=2, profiler_active=3,
        snapshot_start_step=4, snapshot_steps=5, snapshot_stacks="all",
    )  # fmt: skip
    assert cfg.profiler_schedule.warmup == 2 and cfg.snapshot_schedule.wait == 4


def test_switches_keep_their_forms_and_dests():
    parser = add_memscope_args(argparse.ArgumentParser())
    by_flag = {s: a for a in parser._actions for s in a.option_strings}
    assert by_flag["--memscope"].dest == "memscope"
    assert "--memscope-no-" not in by_flag  # --memscope has no hidden negative form
    for s in runtime_settings():
        action = by_flag[s.flag]
        if s.is_switch:
            assert (action.nargs, action.const, action.metavar) == ("?", True, "BOOL")
            assert action.type is parse_bool
            if s.flag != "--memscope":
                hidden = by_flag["--memscope-no-" + s.flag.removeprefix("--memscope-")]
                assert hidden.dest == s.dest and hidden.help == argparse.SUPPRESS
        else:
            assert action.nargs == ("+" if s.is_list else None)


def test_choices_come_from_the_config():
    parser = add_memscope_args(argparse.ArgumentParser())
    by_flag = {s: a for a in parser._actions for s in a.option_strings}
    # any backend name parses: the registry checks it when tracing starts
    assert by_flag["--memscope-backend"].choices is None
    assert tuple(by_flag["--memscope-snapshot-stacks"].choices) == SNAPSHOT_STACKS


def test_help_shows_the_defaults():
    text = add_memscope_args(argparse.ArgumentParser()).format_help()
    assert "(default: 20)" in text and "(default: memscope_outputs)" in text
    assert "(default on;" in text and "(default off;" in text
    assert "Ranks to trace (default: all)" in text
