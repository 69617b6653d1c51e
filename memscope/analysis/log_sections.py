"""The sections of the ``memscope analyze-log`` report, declared as typed sections.

Each :class:`LogSection` pairs a :class:`~memscope.events.sections.SectionSpec` with the
function that makes its value from one explained run (the dict of
:func:`memscope.inputs.log_document.explain_run`); the document writes every run's values under
the specs' names and the specs, in page order, as its ``sections`` index. The Markdown and the
HTML page iterate that index with the runtime report's generic renderers, so a section added
with :func:`register_log_section` reaches all three outputs with no reporter edited. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memscope.events.sections import (
    Column,
    ColumnKind,
    Section,
    SectionLayout,
    SectionSet,
    SectionSpec,
)
from memscope.units import format_bytes, format_percent, format_ratio

Run = dict[str, Any]
B = ColumnKind.BYTES


@dataclass(frozen=True)
class LogSection:
    """One section of every run: its spec and ``build(run) -> JSON-ready value`` (``None``
    when the run has nothing for it)."""

    spec: SectionSpec
    build: Callable[[Run], Any]


def _configuration(run: Run) -> dict[str, Any] | None:
    c = run.get("config")
    if not c:
        return None
    out: dict[str, Any] = {
        "logs": ", ".join(run["sources"]), "configuration from": c["origin"], "where": c["where"],
        "world size": c["world_size"], "world size from": c["world_origin"],
        "rank order": c["rank_order"],
    }  # fmt: skip
    out.update({k: v for k, v in c["layout"].items() if v not in (None, False)})
    machine = c.get("machine") or {}  # absent from a document written before it
    out.update({"GPU": machine.get("gpu"), "Transformer Engine": machine.get("transformer_engine")})
    return {k: v for k, v in out.items() if v is not None}


def _missing(run: Run) -> dict[str, Any] | None:
    if not run.get("error"):
        return None
    reported = "as measured (no grid place, estimate or verdict)" if run["ranks"] else "none"
    return {"not explained": run["error"], "memory lines reported": reported}


def verdict_text(v: dict[str, Any] | None) -> str:
    """A verdict in words: within the band, or above/below by how much and the terms too
    small to explain the gap alone."""
    if not v:
        return "not estimated"
    if v["status"] == "within_band":
        return f"within ±{format_percent(v['band'])}"
    text = f"{v['status']} by {format_bytes(v['error_bytes'], signed=True)}"
    if v["error_ratio"] is not None:
        text += f" ({format_percent(v['error_ratio'])})"
    for alt in v.get("explained_if") or ():  # its reason is in the JSON (``why``)
        text += (f"; within the band with {alt['setting']} ({format_ratio(alt['error_ratio'])}),"
                 " which a log cannot show")  # fmt: skip
    if v["cannot_explain"]:
        text += "; too small alone: " + ", ".join(v["cannot_explain"])
    return text


def _verdicts(run: Run) -> list[dict[str, Any]] | None:
    rows = [
        {
            "rank": r["rank"],
            "iteration": r["iteration"],
            "moment": r["moment"],
            "max_allocated": verdict_text(r["verdict"]),
            "allocated": verdict_text(r["allocated_verdict"]),
            "could_explain": ", ".join((r["verdict"] or {}).get("could_explain") or []),
        }
        for r in run["ranks"]
    ]
    return rows or None


def _estimate_terms(run: Run) -> list[dict[str, Any]] | None:
    first = next((r for r in run["ranks"] if r.get("estimate")), None)
    if first is None:
        return None
    terms = first["estimate"]["terms"].items()
    return [{"rank": first["rank"], "term": k, "bytes": v} for k, v in terms]


def _remedies(run: Run) -> list[dict[str, Any]] | None:
    rows = [
        {**r, "rank": o["rank"], "fits": "yes" if r["fits"] else "no"}
        for o in run["ooms"]
        for r in o["remedies"]
    ]
    return rows or None


def _kept(key: str) -> Callable[[Run], Any]:
    """A section whose value is the run's own key (``None`` when empty)."""
    return lambda run: run.get(key) or None


def _col(key: str, title: str, kind: ColumnKind = ColumnKind.TEXT) -> Column:
    return Column(key, title, kind)


_TABLE, _KV = SectionLayout.TABLE, SectionLayout.KEY_VALUES
#: The built-in sections, in the order pages show them. ``ranks`` and ``ooms`` keep the
#: explained rows (nested: ``measured``, ``estimate``, ``verdict``); their columns name the
#: nested values by dotted keys.
BUILTIN_LOG_SECTIONS: tuple[LogSection, ...] = (
    LogSection(SectionSpec("configuration", "Configuration", _KV, order=10), _configuration),
    LogSection(SectionSpec("missing", "Not explained: what is missing", _KV, order=15), _missing),
    LogSection(SectionSpec(
        "stages", "Per pipeline stage: measured vs predicted max allocated", _TABLE, "log_stages",
        (_col("pp_rank", "stage"), _col("rank", "rank"), _col("iteration", "after iteration"),
         _col("measured_max_allocated_bytes", "measured", B),
         _col("predicted_max_allocated_bytes", "predicted", B), _col("status", "verdict")),
        order=20), _kept("stages")),
    LogSection(SectionSpec(
        "ranks", "Ranks that printed memory: measured vs estimate", _TABLE,
        columns=(_col("rank", "rank"), _col("place", "grid"), _col("iteration", "after iteration"),
                 _col("optimizer_steps", "real optimizer steps"), _col("moment", "moment"),
                 _col("measured.allocated", "allocated", B),
                 _col("measured.max_allocated", "max allocated", B),
                 _col("measured.reserved", "reserved", B),
                 _col("measured.max_reserved", "max reserved", B),
                 _col("estimate.allocated_bytes", "estimate (allocated)", B),
                 _col("estimate.max_allocated_bytes", "estimate (max allocated)", B)),
        order=30), _kept("ranks")),
    LogSection(SectionSpec(
        "verdicts", "Verdicts: measured against the estimator's band", _TABLE,
        columns=(_col("rank", "rank"), _col("iteration", "after iteration"),
                 _col("moment", "moment"), _col("max_allocated", "max allocated"),
                 _col("allocated", "allocated"),
                 _col("could_explain", "terms that could explain it")),
        order=40), _verdicts),
    LogSection(SectionSpec(
        "estimate_terms", "Estimate by term (the first rank estimated)", _TABLE,
        columns=(_col("rank", "rank"), _col("term", "term"), _col("bytes", "bytes", B)),
        order=50), _estimate_terms),
    LogSection(SectionSpec(
        "theoretical", "Megatron's own theoretical figures (first stage, MB)", _KV,
        columns=(_col("weight_and_optimizer_mb", "weight and optimizer"),
                 _col("activation_mb", "activation"), _col("total_mb", "total")),
        order=55), _kept("theoretical")),
    LogSection(SectionSpec(
        "ooms", "Out of memory", _TABLE,
        columns=(_col("rank", "rank"), _col("where", "where", ColumnKind.CODE),
                 _col("sizes.requested", "tried to allocate", B), _col("sizes.total", "total", B),
                 _col("sizes.free", "free", B), _col("sizes.allocated", "allocated by PyTorch", B),
                 _col("sizes.reserved_unallocated", "reserved but unallocated", B),
                 _col("moment", "moment"), _col("estimate.peak_bytes", "estimate", B),
                 _col("need_bytes", "need at least", B),
                 _col("capacity_bytes", "PyTorch could hold", B),
                 _col("fragmentation.advice", "fragmentation")),
        order=60), _kept("ooms")),
    LogSection(SectionSpec(
        "remedies", "Remedies, sized against the failing rank's measured bytes", _TABLE,
        columns=(_col("rank", "rank"), _col("name", "remedy"),
                 _col("flags", "flags", ColumnKind.CODE), _col("saving_bytes", "saving", B),
                 _col("projected_need_bytes", "projected need", B), _col("fits", "fits")),
        order=70), _remedies),
    LogSection(SectionSpec("notes", "Notes", _TABLE, columns=(_col("value", "note"),), order=80),
               _kept("notes")),
)  # fmt: skip

_registered: list[LogSection] = list(BUILTIN_LOG_SECTIONS)


def register_log_section(section: LogSection) -> None:
    """Add a section to every run of the log report (its name must be new)."""
    if any(s.spec.name == section.spec.name for s in _registered):
        raise ValueError(f"the log report already has a section {section.spec.name!r}")
    _registered.append(section)


def unregister_log_section(name: str) -> None:
    """Remove a section :func:`register_log_section` added (a built-in one stays)."""
    if any(s.spec.name == name for s in BUILTIN_LOG_SECTIONS):
        raise ValueError(f"{name!r} is a built-in section of the log report")
    _registered[:] = [s for s in _registered if s.spec.name != name]


def log_sections() -> tuple[LogSection, ...]:
    """The registered sections, built-in first."""
    return tuple(_registered)


def add_section_values(run: Run) -> SectionSet:
    """Build every registered section of ``run``, write each value under its name (a run
    key a section keeps is left as it is) and return them as one :class:`SectionSet`."""
    built = []
    for section in log_sections():
        value = section.build(run)
        built.append(Section(section.spec, value))
    for item in built:
        run.setdefault(item.spec.name, item.value)
    return SectionSet(built)


def sections_index() -> list[dict[str, Any]]:
    """The report's ``sections`` index: every registered spec, in the order pages show them."""
    return SectionSet([Section(s.spec, None) for s in log_sections()]).index()
