"""Static estimate versus runtime, overall and per memory category (``comparisons``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memscope.events.schema import CATEGORIES, MemoryEvent
from memscope.events.sections import SectionLayout, SectionSpec

NO_ESTIMATE_REASON = "no static estimate is available for this run"


@dataclass(frozen=True)
class StaticEstimate:
    """A run's static estimate (``peak_memory_bytes``, ``components``, ``source``), or why
    there is none."""

    estimate: dict[str, Any] | None
    missing_reason: str = NO_ESTIMATE_REASON

    def to_dict(self) -> dict[str, Any]:
        return {"estimate": self.estimate, "missing_reason": self.missing_reason}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> StaticEstimate:
        if not d:
            return cls(None)
        return cls(d.get("estimate"), str(d.get("missing_reason") or NO_ESTIMATE_REASON))


def _diff(static: int | None, runtime: int | None) -> tuple[int | None, float | None]:
    if static is None or runtime is None:
        return None, None
    diff = static - runtime
    return diff, (diff / runtime if runtime else None)


def measured_in_flight(composition: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """(Chunk-)microbatches whose saved activations were live at the peak, from its
    composition: how many, and the bytes of each (by ``chunk:microbatch``). ``None`` without a
    composition that names microbatches."""
    per: dict[str, int] = {}
    for item in (composition or {}).get("items") or []:
        if item.get("category") != "activations" or item.get("microbatch") is None:
            continue
        if item.get("saved") is False:  # a temporary of the running op, not a kept tensor
            continue
        chunk = item.get("virtual_chunk")
        key = f"{0 if chunk is None else chunk}:{item['microbatch']}"
        per[key] = per.get(key, 0) + int(item.get("bytes") or 0)
    if not per:
        return None
    return {"microbatches": len(per), "bytes_by_microbatch": dict(sorted(per.items()))}


def _static_parts(estimate: Mapping[str, Any]) -> dict[str, int]:
    """The estimate's bytes per runtime category. The estimator counts Megatron's global
    memory buffer (``buffer_bytes``, activations.py) inside its activation-side transient; at
    runtime that buffer is the run-long ``buffers`` category, so it is moved there, like for
    like."""
    parts = dict(estimate.get("components") or {})
    buffer = estimate.get("buffer_bytes")
    if "buffers" not in parts and buffer and parts.get("activations") is not None:
        parts["buffers"] = int(buffer)
        parts["activations"] = int(parts["activations"]) - int(buffer)
    return parts


# What the in-run estimate says about its own inputs (inputs/inrun.py): passed on.
SPEC_KEYS = ("spec_inputs", "spec_sources", "spec_disagreements", "spec_notes")


def compare_with_static(
    runtime_peak_bytes: int,
    runtime_categories: Mapping[str, int] | None,
    static: StaticEstimate,
    in_flight: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``comparisons`` section; ``diff = static - runtime`` (positive: overestimate).

    When there is no estimate the static side is reported missing, with the reason, and no
    number is invented.
    """
    estimate = static.estimate
    if estimate is None:
        return {
            "status": "missing",
            "reason": static.missing_reason,
            "static_peak_memory_bytes": None,
            "runtime_peak_memory_bytes": runtime_peak_bytes,
            "peak_diff_bytes": None,
            "peak_diff_ratio": None,
            "components": [],
        }
    static_peak = estimate.get("peak_memory_bytes")
    diff, ratio = _diff(static_peak, runtime_peak_bytes)
    components = []
    static_parts = _static_parts(estimate)
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
        "in_flight": {
            "predicted": estimate.get("in_flight_microbatches"),
            "predicted_per_chunk": estimate.get("in_flight_per_chunk") or None,
            "measured": in_flight,
        },
        "static_peak_memory_bytes": static_peak,
        "runtime_peak_memory_bytes": runtime_peak_bytes,
        "peak_diff_bytes": diff,
        "peak_diff_ratio": ratio,
        "components": components,
        "static_source": estimate.get("source"),
        **{k: estimate[k] for k in SPEC_KEYS if k in estimate},
    }


class StaticComparisonAnalyzer:
    """Compares the ``peak`` section (built before it) with the run's static estimate."""

    section_specs = (
        SectionSpec(
            "comparisons",
            "Static estimate vs runtime",
            SectionLayout.CUSTOM,
            "comparisons",
            order=40,
        ),
    )

    def __init__(self, static: StaticEstimate) -> None:
        self.static = static

    def consume(self, event: MemoryEvent) -> None:
        """The comparison needs only the peak section."""

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        peak = prior.get("peak") or {}
        runtime_peak = int(peak.get("memory_bytes") or 0)
        in_flight = measured_in_flight(peak.get("composition"))
        return {
            "comparisons": compare_with_static(
                runtime_peak, peak.get("categories"), self.static, in_flight
            )
        }
