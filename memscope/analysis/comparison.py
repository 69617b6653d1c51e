"""Static-estimate versus runtime comparison, overall and per memory category."""

from __future__ import annotations

from typing import Any

from memscope.events.schema import CATEGORIES


def _diff(static: int | None, runtime: int | None) -> tuple[int | None, float | None]:
    if static is None or runtime is None:
        return None, None
    diff = static - runtime
    return diff, (diff / runtime if runtime else None)


def compare_with_static(
    runtime_peak_bytes: int,
    runtime_categories: dict[str, int] | None,
    static_estimate: dict[str, Any] | None,
    missing_reason: str = "no static estimate is available for this run",
) -> dict[str, Any]:
    """The ``comparisons`` section; ``diff = static - runtime`` (positive: overestimate).

    ``static_estimate`` holds ``peak_memory_bytes`` and optionally ``components`` (bytes per
    category name). When it is ``None`` the static side is reported missing, with the
    reason, and no number is invented.
    """
    if static_estimate is None:
        return {
            "status": "missing",
            "reason": missing_reason,
            "static_peak_memory_bytes": None,
            "runtime_peak_memory_bytes": runtime_peak_bytes,
            "peak_diff_bytes": None,
            "peak_diff_ratio": None,
            "components": [],
        }
    static_peak = static_estimate.get("peak_memory_bytes")
    diff, ratio = _diff(static_peak, runtime_peak_bytes)
    components = []
    static_parts = static_estimate.get("components") or {}
    for name in CATEGORIES:
        runtime_value = runtime_categories.get(name) if runtime_categories else None
        static_value = static_parts.get(name)
        if runtime_value is None and static_value is None:
            continue
        c_diff, c_ratio = _diff(static_value, runtime_value)
        components.append(
            {
                "component": name,
                "static_bytes": static_value,
                "runtime_bytes": runtime_value,
                "diff_bytes": c_diff,
                "diff_ratio": c_ratio,
            }
        )
    return {
        "status": "ok",
        "static_peak_memory_bytes": static_peak,
        "runtime_peak_memory_bytes": runtime_peak_bytes,
        "peak_diff_bytes": diff,
        "peak_diff_ratio": ratio,
        "components": components,
        "static_source": static_estimate.get("source"),
    }
