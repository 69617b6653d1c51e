// The training-log page's content computed from one run of log_report.json
// (memscope/analysis/log_check.py). Pure functions.

function gridText(g) {
  return g ? Object.entries(g).map(([k, v]) => k + v).join(" ") : "unknown";
}

function verdictText(v) {
  if (v.status === "within_band") return "within ±" + fmtRatio(v.band, true);
  let t = v.status + " by " + fmtBytes(v.error_bytes, true);
  if (v.error_ratio !== null) t += " (" + fmtRatio(v.error_ratio) + ")";
  if (v.cannot_explain.length) t += "; too small alone: " + v.cannot_explain.join(", ");
  return t;
}

function configText(c) {
  if (!c) return "";
  const shown = Object.entries(c.layout).filter(([, v]) => v !== null && v !== false);
  return "From the " + c.origin + " (" + c.where + "); world size " + c.world_size + " (" +
    c.world_origin + "); " + shown.map(([k, v]) => k + " " + v).join(", ");
}

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

const LOG_RANK_COLUMNS = [["rank", "rank"], ["grid", "grid"], ["iteration", "after iteration"],
  ["steps", "real optimizer steps"], ["allocated", "allocated", "bytes"],
  ["max_allocated", "max allocated", "bytes"], ["reserved", "reserved", "bytes"],
  ["max_reserved", "max reserved", "bytes"], ["estimate_allocated", "estimate (allocated)", "bytes"],
  ["estimate", "estimate (max allocated)", "bytes"], ["moment", "moment"], ["verdict", "verdict"]];

function logRankRows(run) {
  return run.ranks.map(r => ({rank: r.rank, grid: gridText(r.grid), iteration: r.iteration,
    steps: r.optimizer_steps, allocated: r.measured.allocated, max_allocated: r.measured.max_allocated,
    reserved: r.measured.reserved, max_reserved: r.measured.max_reserved,
    estimate_allocated: r.estimate ? r.estimate.allocated_bytes : null,
    estimate: r.estimate ? r.estimate.max_allocated_bytes : null, moment: r.moment,
    verdict: r.verdict ? verdictText(r.verdict) : "not estimated"}));
}

function oomText(o) {
  const s = o.sizes, rank = o.rank === null ? "unknown" : o.rank;
  return "Rank " + rank + " (" + o.where + "): tried to allocate " + fmtBytes(s.requested) + " of " +
    fmtBytes(s.total) + "; free " + fmtBytes(s.free) + "; allocated " + fmtBytes(s.allocated) +
    "; reserved but unallocated " + fmtBytes(s.reserved_unallocated) +
    (o.fragmentation.advice ? "; " + o.fragmentation.advice : "");
}

function oomEstimateText(o) {
  return "Estimate (" + o.moment + "): " + fmtBytes(o.estimate.peak_bytes) + "; need at least " +
    fmtBytes(o.need_bytes) + " of " + fmtBytes(o.capacity_bytes) + " PyTorch could hold.";
}

const LOG_REMEDY_COLUMNS = [["name", "remedy"], ["flags", "flags"], ["saving_bytes", "saving", "bytes"],
  ["projected_need_bytes", "projected need", "bytes"], ["fit", "fits"]];

function logRemedyRows(o) {
  return o.remedies.map(r => Object.assign({}, r, {fit: r.fits ? "yes" : "no"}));
}
