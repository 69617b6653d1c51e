// The training-log page's content computed from one run of log_report.json
// (memscope/analysis/log_sections.py declares its sections). Pure functions.

// Each stage's heaviest rank, then each out-of-memory message (what it held + its request).
function logBars(run) {
  const stages = run.stages.map(s => ({name: "stage " + s.pp_rank + " (rank " + s.rank + ")",
    measured: s.measured_max_allocated_bytes, predicted: s.predicted_max_allocated_bytes}));
  const ooms = run.ooms.map(o => ({name: "OOM, rank " + (o.rank === null ? "?" : o.rank) + ": allocated + request",
    measured: (o.sizes.allocated || 0) + (o.sizes.requested || 0), predicted: o.estimate.peak_bytes}));
  return stages.concat(ooms);
}

function logStageTraces(bars) {
  return groupedBars(bars.map(b => b.name), [{name: "measured", values: bars.map(b => b.measured)},
    {name: "predicted", values: bars.map(b => b.predicted)}]);
}

// The page entries of one run's sections index that a function of `registry` draws, in the
// index's order (a generic section is all markup, drawn by the template).
function scriptedSections(entries, registry) {
  return entries.filter(e => e.renderer && Object.prototype.hasOwnProperty.call(registry, e.renderer));
}

// The element id prefix of run i's sections (the template's section_prefix).
function runPrefix(i) {
  return "run" + i + "-";
}
