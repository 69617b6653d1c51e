"""Human-readable units, with signs (a negative delta stays negative), and text made safe to
print: the only formatting every room may use.

Values come from files a user hands us, so nothing here trusts them: a number that is not a
finite real below :data:`MAX_BYTES` formats as ``"invalid"`` (never ``"inf PiB"`` or
``"+nan%"``), and :func:`printable` escapes control characters, lone surrogates and the
Unicode line and direction controls before a string reaches a terminal or a Markdown file.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_HALF_UP, Decimal

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")

#: Largest magnitude shown as a byte count (8 EiB, the int64 limit); beyond it is "invalid".
MAX_BYTES = 2**63
INVALID = "invalid"


def _finite_number(value: object) -> float | None:
    """``value`` as a float when it is a real, finite number (not a bool) of magnitude below
    :data:`MAX_BYTES`, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) < MAX_BYTES else None
    return value if math.isfinite(value) and abs(value) < MAX_BYTES else None


#: The one rounding rule for every number shown (console, Markdown, the HTML pages' script,
#: which receives these values as ``RULES``): the exact value rounded half away from zero to
#: a fixed number of decimals, which is what JavaScript's ``toFixed`` does; a value that
#: rounds to zero is shown without a sign ("0.0%", never "-0.0%").
BYTES_DECIMALS = 2
PERCENT_DECIMALS = 1
#: A difference is coloured as an alarm only when it is at least this share of what it is
#: compared with (a 16-byte difference on a 2 GiB peak is not news).
ALARM_RATIO = 0.01
NUMBER_RULES = {
    "bytes_decimals": BYTES_DECIMALS,
    "percent_decimals": PERCENT_DECIMALS,
    "alarm_ratio": ALARM_RATIO,
}


def fixed(value: float, decimals: int) -> str:
    """``abs(value)`` with ``decimals`` decimals, rounded half away from zero (the rule above)."""
    quantum = Decimal(1).scaleb(-decimals)
    return str(Decimal(abs(value)).quantize(quantum, rounding=ROUND_HALF_UP))


def _signed(digits: str, negative: bool, signed: bool) -> str:
    """``digits`` with its sign: none when it shows zero, ``+`` only when ``signed``."""
    if not digits.strip("0."):
        return digits
    return ("-" if negative else "+" if signed else "") + digits


def format_bytes(value: int | float | None, signed: bool = False) -> str:
    """``1536 -> '1.50 KiB'``; ``-2048 -> '-2.00 KiB'``; ``None -> 'n/a'``; a value that is
    not a finite number of at most 8 EiB -> ``'invalid'``."""
    if value is None:
        return "n/a"
    number = _finite_number(value)
    if number is None:
        return INVALID
    size = abs(number)
    unit = 0
    while size >= 1024 and unit < len(_UNITS) - 1:
        size /= 1024
        unit += 1
    digits = str(int(size)) if unit == 0 else fixed(size, BYTES_DECIMALS)
    return f"{_signed(digits, number < 0, signed)} {_UNITS[unit]}"


def format_duration(seconds: int | float | None) -> str:
    """A duration in the unit that reads best: ``0.000412 -> '412 µs'``, ``0.0345 ->
    '34.5 ms'``, ``2.5 -> '2.50 s'``, ``125 -> '2 min 5 s'``; ``None -> 'n/a'``."""
    if seconds is None:
        return "n/a"
    number = _finite_number(seconds)
    if number is None or number < 0:
        return INVALID
    if number >= 60:
        minutes, rest = divmod(int(fixed(number, 0)), 60)
        return f"{minutes} min {rest} s"
    if number >= 1:
        return f"{fixed(number, 2)} s"
    if number >= 1e-3:
        return f"{fixed(number * 1e3, 1)} ms"
    return f"{fixed(number * 1e6, 0)} µs"


def format_ratio(value: float | None) -> str:
    """A signed percentage, ``0.031 -> '+3.1%'``, ``-0.0001 -> '0.0%'``; ``None -> 'n/a'``;
    not a finite number -> ``'invalid'``."""
    return _percent(value, signed=True)


def format_percent(value: float | None) -> str:
    """A share as a percentage, ``0.5 -> '50.0%'`` (the same rule, no ``+``)."""
    return _percent(value, signed=False)


def _percent(value: float | None, signed: bool) -> str:
    if value is None:
        return "n/a"
    number = _finite_number(value)
    if number is None:
        return INVALID
    return _signed(fixed(number * 100, PERCENT_DECIMALS), number < 0, signed) + "%"


# C0 and C1 controls, DEL, lone surrogates, line/paragraph separators, bidi overrides/isolates.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """``str(text)`` with every control character, lone surrogate and Unicode line or
    direction control written as a visible ``\\xNN`` / ``\\uNNNN`` escape: one line, safe to
    encode as UTF-8, and nothing that can move a terminal's cursor or reorder its text."""
    return _UNPRINTABLE.sub(_escape, text if isinstance(text, str) else str(text))
