"""Human-readable units, with signs (a negative delta stays negative)."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(value: int | float | None, signed: bool = False) -> str:
    """``1536 -> '1.50 KiB'``; ``-2048 -> '-2.00 KiB'``; ``None -> 'n/a'``."""
    if value is None:
        return "n/a"
    sign = "-" if value < 0 else ("+" if signed and value > 0 else "")
    size = float(abs(value))
    unit = 0
    while size >= 1024 and unit < len(_UNITS) - 1:
        size /= 1024
        unit += 1
    if unit == 0:
        return f"{sign}{int(size)} B"
    return f"{sign}{size:.2f} {_UNITS[unit]}"


def format_ratio(value: float | None) -> str:
    """A signed percentage, ``0.031 -> '+3.1%'``."""
    if value is None:
        return "n/a"
    return f"{value * 100:+.1f}%"
