// The rank page's content computed from its payload (memscope/reporters/html_payload.py,
// runtime_payload): cards, chart traces and table rows. Pure functions of the payload.

function oomSentence(O) {
  const w = O.where;
  const mb = w.microbatch != null ? ", microbatch " + w.microbatch : "";
  return `Step ${w.step}, ${w.phase}, ${w.module || NO_MODULE}${mb}: requested ${fmtBytes(O.requested_bytes)}` +
    ` with ${fmtBytes(O.allocated_bytes)} allocated and ${fmtBytes(O.cached_free_bytes)} cached free.` +
    ` ${O.verdict_reason}. Trend: ${O.trend} (${O.trend_reason}).`;
}

const REMEDY_COLUMNS = [["name", "remedy"], ["flags", "flags"], ["predicted_peak_bytes", "predicted peak", "bytes"],
  ["saving_bytes", "saving", "bytes"], ["note", "note"]];

// The index of the step that ended with the most device memory used (-1 when none was read).
function mostUsedStep(used) {
  let best = -1;
  used.forEach((v, i) => {
    if (finite(v) && (best < 0 || v > used[best])) best = i;
  });
  return best;
}

function deviceUsedCard(S, G) {
  const i = mostUsedStep(S.device_used_end);
  if (i < 0) return ["Device used (most at a step end)", "n/a", "no step read the device"];
  const retries = G.alloc_retries_total ?? "n/a", ooms = G.ooms_total ?? "n/a";
  return ["Device used (most at a step end)", fmtBytes(S.device_used_end[i]),
    `step ${S.step[i]}: outside PyTorch ${fmtBytes(S.outside_pytorch_end[i])}, reserved − allocated ` +
    `${fmtBytes(S.cached_free_end[i])}; ${retries} allocation retries, ${ooms} OOMs in all`];
}

function staticCards(comp) {
  const ok = comp.status === "ok";
  return [
    ["Static estimate", ok ? fmtBytes(comp.static_peak_memory_bytes) : "missing", ok ? (comp.static_source || "") : (comp.reason || "")],
    ["Static − runtime", ok ? fmtBytes(comp.peak_diff_bytes, true) : "n/a", ok ? fmtRatio(comp.peak_diff_ratio) : ""],
  ];
}

function categoriesText(categories) {
  return Object.entries(categories).filter(e => e[1]).map(e => e[0] + " " + fmtBytes(e[1])).join(", ");
}

// [title, value, note] for each card at the top of the page.
function runtimeCards(P) {
  const peak = P.peak || {}, comp = P.comparisons || {};
  const reserved = P.notes.reserved ? ["Peak reserved", "n/a", P.notes.reserved]
    : ["Peak reserved", fmtBytes(peak.reserved_bytes), "backend " + (P.metadata.backend || "?")];
  const cards = [["Peak allocated", fmtBytes(peak.memory_bytes), momentText(peak)], reserved].concat(staticCards(comp));
  if (P.notes.gpu_signals) cards.push(["Device used", "n/a", P.notes.gpu_signals]);
  else cards.push(deviceUsedCard(P.steps, P.gpu_totals));
  if (peak.categories) cards.push(["Live at the peak", categoriesText(peak.categories), ""]);
  return cards;
}

function compositionLabel(i) {
  const chunk = i.virtual_chunk != null ? "chunk " + i.virtual_chunk : null;
  return joinParts([i.module || NO_MODULE, i.phase || null, microbatchText(i.microbatch), chunk]);
}

// One stacked bar per category; each band one composition item.
function compositionBars(C) {
  return C.items.map(i => ({
    type: "bar", x: plotlyValues([i.category]), y: mib([i.bytes]), name: plotlyText(compositionLabel(i)), showlegend: false,
    marker: {color: categoryColor(i.category), line: {color: "#fff", width: 0.5}}, text: hover([i.bytes]),
    textposition: "none", hovertemplate: "%{fullData.name}<br>%{text}<extra>%{x}</extra>",
  }));
}

const COMPOSITION_COLUMNS = [["category", "category"], ["kept", "saved for backward"], ["module", "created in module"],
  ["phase", "phase"], ["microbatch", "microbatch"], ["virtual_chunk", "chunk"], ["bytes", "bytes", "bytes"]];

function keptText(saved) {
  return saved === true ? "saved" : saved === false ? "temporary" : "";
}

function compositionRows(C) {
  return C.items.map(i => Object.assign({kept: keptText(i.saved)}, i));
}

// The stacked total of the bands at each sample.
function stackTotals(times, bands) {
  return times.map((_, k) => bands.reduce((sum, b) => sum + b.bytes[k], 0));
}

// One filled band per holder; a category's first band carries its legend entry.
function activeBands(A) {
  const ms = A.time_us.map(t => t / 1000), seen = {};
  return A.bands.map(b => {
    const k = seen[b.category] = (seen[b.category] || 0) + 1;
    const c = categoryColor(b.category, k - 1), name = plotlyText(b.category);
    return {
      type: "scatter", mode: "lines", stackgroup: "active", x: plotlyValues(ms), y: mib(b.bytes), name: name,
      legendgroup: name, showlegend: k === 1, line: {width: 0.5, color: c}, fillcolor: c, meta: plotlyText(b.label),
      text: hover(b.bytes), hovertemplate: "%{meta}<br>%{text} at %{x} ms<extra>%{fullData.name}</extra>",
    };
  });
}

function activeLayout(A) {
  const total = stackTotals(A.time_us, A.bands), at = A.peak_index;
  const lay = layout("ms since the step's first allocator event");
  return Object.assign(lay, peakMarker(A.time_us[at] / 1000, total[at], "peak " + fmtBytes(total[at])));
}

function activeNote(A) {
  const what = A.step === null ? "The whole recorded window" : "Step " + A.step;
  return what + `: ${A.time_us.length} samples of ${A.events} allocator events (min/max per bucket; the peak kept),` +
    ` ${A.bands.length} bands. Each band is what one module allocated in one phase, or what one owner holds;` +
    " hover names it. Holders that did not change during the step are one band per category.";
}

const IDLE_COLUMNS = [["label", "holder"], ["category", "category"], ["bytes", "idle bytes at the peak", "bytes"],
  ["count", "blocks"], ["idle_ms", "idle for (ms)"], ["peak_drop", "peak drop", "bytes"], ["pattern", "pattern"]];

function idleRows(idle) {
  return idle.map(f => Object.assign({}, f, {idle_ms: (f.idle_us / 1000).toFixed(1)}));
}

function stepLine(S, y, name, i, extra) {
  return Object.assign({
    x: plotlyValues(S.step), y: mib(y), name: plotlyText(name), text: hover(y),
    hovertemplate: "step %{x}: %{text}<extra>%{fullData.name}</extra>", line: {color: color(i)},
  }, extra);
}

// The step timeline: high-water mark, allocated at start and end, reserved and device used
// where the backend reads them.
function timelineTraces(S, notes) {
  const traces = [
    stepLine(S, S.peak_allocated, "peak allocated (high-water)", 0, {mode: "lines+markers"}),
    stepLine(S, S.allocated_start, "allocated at step start", 3, {mode: "lines", line: {color: color(3), dash: "dash"}}),
    stepLine(S, S.allocated_end, "allocated at step end", 1, {mode: "lines+markers"}),
  ];
  if (!notes.reserved) {
    traces.push(stepLine(S, S.reserved_end, "reserved at step end", 2, {mode: "lines", line: {color: color(2), dash: "dot"}}));
  }
  if (!notes.gpu_signals) {
    const dashdot = {mode: "lines", line: {color: color(4), dash: "dashdot"}};
    traces.push(stepLine(S, S.device_used_end, "device used at step end", 4, dashdot));
  }
  return traces;
}

function timelineNote(S, total) {
  if (S.step.length >= total) return "";
  return `${S.step.length} of ${total} steps plotted (min/max per bucket; the peak step is always kept).`;
}

const GPU_COLUMNS = [["step", "step"], ["device_used_end", "device used", "bytes"], ["outside_pytorch_end", "outside PyTorch", "bytes"],
  ["cached_free_end", "reserved − allocated", "bytes"], ["alloc_retries", "alloc retries"], ["ooms", "OOMs"]];

// One row per step that read the device.
function gpuRows(S) {
  const rows = S.step.map((step, i) => ({
    step: step, device_used_end: S.device_used_end[i], outside_pytorch_end: S.outside_pytorch_end[i],
    cached_free_end: S.cached_free_end[i], alloc_retries: S.alloc_retries[i], ooms: S.ooms[i],
  }));
  return rows.filter(r => r.device_used_end !== null && r.device_used_end !== undefined);
}

function transitionsSummary(T) {
  const counts = Object.entries(T.counts).map(e => spaced(e[0]) + ": " + e[1]).join(", ");
  const listed = T.transitions.length < T.transitions_total
    ? ` (${T.transitions.length} of ${T.transitions_total} changes listed)` : "";
  return counts + listed + ". Leaks are judged on allocated bytes only; moves within " + (T.tolerance * 100) +
    "% of allocated are steady.";
}

function leakText(l) {
  return `leak candidate, steps ${l.first_step}–${l.last_step}: allocated grew ${fmtBytes(l.bytes_per_step)} per step` +
    ` (${fmtBytes(l.bytes_added)} in all)`;
}

function suspectText(x) {
  const mb = x.microbatch != null ? ", microbatch " + x.microbatch : "";
  const where = x.stack ? `, created at ${x.stack[0]}` : "";
  return `suspect ${x.module || NO_MODULE} (${x.phase}${mb}): ${fmtBytes(x.bytes_per_step)} per step` +
    ` born in steps ${x.birth_steps.join(", ")}, still live` + where;
}

function transitionColumns(notes) {
  const reserved = notes.reserved ? [] : [["reserved_delta", "reserved Δ", "delta"]];
  return [["step", "step"], ["kind", "kind"], ["allocated_delta", "allocated Δ", "delta"]].concat(reserved,
    [["outside_pytorch_delta", "outside PyTorch Δ", "delta"], ["cause", "cause"]]);
}

function transitionRows(T) {
  return T.transitions.map(x => Object.assign({}, x, {kind: spaced(x.kind)}));
}

// The steps offered in the within-step chart, in step order.
function withinSteps(within) {
  return Object.keys(within).sort((a, b) => Number(a) - Number(b));
}

function withinLabel(W, j) {
  const mb = W.microbatch[j], bytes = fmtBytes(W.mem_allocated_after[j]);
  return `${W.event_type[j]} ${W.module[j] || ""} · microbatch ${mb} · ${bytes} (Δ ${fmtBytes(W.delta_allocated[j], true)})`;
}

// One marker trace per value of W[key] (phase, microbatch or event type), then the
// high-water mark as a line.
function withinTraces(W, key) {
  const groups = [...new Set(W[key])];
  const traces = groups.map((g, i) => {
    const idx = W[key].map((v, j) => (v === g ? j : -1)).filter(j => j >= 0);
    const name = key === "microbatch" ? "microbatch " + g : String(g);
    return {
      x: plotlyValues(idx.map(j => W.order[j])), y: mib(idx.map(j => W.mem_allocated_after[j])), name: plotlyText(name),
      mode: "markers", marker: {color: color(i + 3), size: 5}, text: idx.map(j => plotlyText(withinLabel(W, j))),
      hovertemplate: "%{text}<extra>%{fullData.name}</extra>",
    };
  });
  traces.push({
    x: plotlyValues(W.order), y: mib(W.max_mem_allocated), name: plotlyText("high-water mark"), mode: "lines",
    line: {color: "#888", width: 1}, text: hover(W.max_mem_allocated), hovertemplate: "%{text}<extra>high-water</extra>",
  });
  return traces;
}

// Where the within-step chart marks the peak: in the run's peak step (M given), the report's
// attributed peak (the same step, phase, module and microbatch as the card); in another step,
// the first event whose high-water mark reached the step's highest. null when not found.
function withinPeak(W, M) {
  if (M) {
    const at = W.order.indexOf(M.order);
    const label = joinParts(["run peak " + fmtBytes(M.bytes), M.phase, M.module || NO_MODULE, microbatchText(M.microbatch)]);
    return at < 0 ? null : {order: M.order, bytes: M.bytes, label: label};
  }
  const marks = W.max_mem_allocated.filter(finite);
  if (!marks.length) return null;
  const top = Math.max(...marks), at = W.max_mem_allocated.indexOf(top);
  return {order: W.order[at], bytes: top, label: "step peak " + fmtBytes(top) + " · " + (W.module[at] || W.event_type[at])};
}

function withinLayout(W, M) {
  const lay = layout("event order within the step"), mark = withinPeak(W, M);
  return mark ? Object.assign(lay, peakMarker(mark.order, mark.bytes, mark.label)) : lay;
}

const PHASE_COLUMNS = [["phase", "phase"], ["count", "events"], ["in_phase", "max allocated in the phase"],
  ["max_mem_allocated_after", "max allocated after", "bytes"], ["max_delta_allocated", "max Δ", "delta"],
  ["min_delta_allocated", "min Δ", "delta"]];

// A phase below the mark set elsewhere in its step shows its highest reading as a lower bound.
function isLowerBound(p) {
  return p.max_mem_allocated_source === "readings";
}

function phaseRows(phases) {
  return phases.map(p => Object.assign({}, p, {in_phase: (isLowerBound(p) ? "≥ " : "") + fmtBytes(p.max_mem_allocated)}));
}

const TOP_COLUMNS = [["event_type", "event"], ["module", "module"], ["kind", "kind"], ["phase", "phase"], ["count", "count"],
  ["mem_allocated_after", "allocated after", "bytes"], ["max_delta_allocated", "max Δ", "delta"],
  ["min_delta_allocated", "min Δ", "delta"], ["worst_step", "worst step"], ["worst_microbatch", "microbatch"]];

const MODULE_COLUMNS = [["module", "module"], ["module_class", "class"], ["count", "events"],
  ["max_allocated_after", "max allocated after", "bytes"], ["max_delta_allocated", "max Δ", "delta"],
  ["min_delta_allocated", "min Δ", "delta"]];

const STATIC_COLUMNS = [["component", "component"], ["static_bytes", "static", "bytes"], ["runtime_bytes", "runtime", "bytes"],
  ["diff_bytes", "static − runtime", "delta", "peak"]];

// Each component with the runtime peak its shortfall is judged against.
function staticRows(comp) {
  return (comp.components || []).map(c => Object.assign({peak: comp.runtime_peak_memory_bytes}, c));
}

function errorRows(P) {
  const errors = P.errors.map(e => Object.assign({kind: "error"}, e));
  return errors.concat(P.warnings.map(w => ({kind: "warning", first_error: w})));
}

function metadataRows(P) {
  return keyValueRows(Object.assign({}, P.metadata, {schema_version: P.schema_version, tool_version: P.tool_version}));
}
