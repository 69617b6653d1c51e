"""add_memscope_args: every switch settable on and off, FlagScale-style, and composition."""

import argparse

import pytest

from memscope.config import RuntimeConfig
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
