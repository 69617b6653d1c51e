"""Megatron argparse integration: ``add_memscope_args`` and provider composition.

Every switch takes an optional boolean value, so it can be turned on *and* off from a
FlagScale YAML, whose runner turns ``key: true`` into a bare ``--key`` and drops
``key: false``: write ``memscope_hook_modules: "false"`` (or ``0``) to turn a default-on
switch off, or use the matching ``--memscope-no-...`` switch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from memscope.config import FLAG_PREFIX, Setting, runtime_settings

ArgsProvider = Callable[[argparse.ArgumentParser], argparse.ArgumentParser]

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}


def parse_bool(text: str | bool) -> bool:
    """Parse ``true/false``, ``on/off``, ``yes/no``, ``1/0`` (any case)."""
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false, on/off, 1/0), got {text!r}")


def _shown(s: Setting) -> str:
    if s.shown_default is not None:
        return s.shown_default
    value = s.cli_default
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def _add_switch(group: argparse._ArgumentGroup, s: Setting) -> None:
    """``--flag [BOOL]`` (bare: on) and, below ``--memscope-``, a hidden ``--memscope-no-...``."""
    state = "on" if s.default else "off"
    group.add_argument(
        s.flag,
        dest=s.dest,
        nargs="?",
        const=True,
        default=s.default,
        type=parse_bool,
        metavar="BOOL",
        help=f"{s.help} (default {state}; '{s.flag} false' turns it off)".replace("%", "%%"),
    )
    if s.flag.startswith(FLAG_PREFIX):
        group.add_argument(
            FLAG_PREFIX + "no-" + s.flag.removeprefix(FLAG_PREFIX),
            dest=s.dest,
            action="store_false",
            help=argparse.SUPPRESS,
        )


def _add_value(group: argparse._ArgumentGroup, s: Setting) -> None:
    group.add_argument(
        s.flag,
        dest=s.dest,
        type=s.value_type,
        nargs="+" if s.is_list else None,
        choices=s.choices,
        metavar=s.metavar,
        default=s.cli_default,
        help=f"{s.help} (default: {_shown(s)})".replace("%", "%%"),
    )


def add_memscope_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register MemScope's arguments on ``parser`` (a Megatron ``extra_args_provider``).

    One flag per :class:`~memscope.config.RuntimeConfig` setting, built from its field.
    """
    group = parser.add_argument_group(title="memscope")
    for s in runtime_settings():
        if s.is_switch:
            _add_switch(group, s)
        else:
            _add_value(group, s)
    return parser


def compose_args_providers(*providers: ArgsProvider | None) -> ArgsProvider:
    """One ``extra_args_provider`` calling each given provider in turn (``None`` skipped).

    Megatron accepts exactly one provider; FlagScale's ``train_gpt.py`` already passes
    ``add_modelopt_args``, so pass ``compose_args_providers(add_memscope_args, that)``.
    """
    chain = [p for p in providers if p is not None]

    def provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        for p in chain:
            result = p(parser)
            parser = parser if result is None else result
        return parser

    return provider
