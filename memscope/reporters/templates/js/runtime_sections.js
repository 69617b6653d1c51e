// The rank page's section renderers: RANK_SECTIONS maps the renderer name a section's spec
// gives (memscope/events/sections.py) to the function that fills its partial
// (templates/sections/<name>.html.j2) from the payload. The page draws the report's sections
// index in its order (drawSections, sections.js); a section with no function here is all markup (the
// generic ones, laid out by the template).

function showOom(O) {  // the first thing a user of an OOMed rank needs
  const box = document.getElementById("oom");
  box.appendChild(el("h2", {}, "Out of memory: " + O.verdict + " OOM"));
  box.appendChild(el("p", {}, oomSentence(O)));
  box.appendChild(el("table", {id: "remedies"}));
  table("remedies", REMEDY_COLUMNS, O.remedies || []);
}

function showComposition(peak, notes) {
  const C = peak.composition;
  if (!C || !C.items.length) {
    document.getElementById("composition").appendChild(el("p", {className: "muted"}, peak.composition_note || notes.composition));
    return;
  }
  plot("composition", compositionBars(C), Object.assign(layout("category"), {barmode: "stack"}));
  table("composition-table", COMPOSITION_COLUMNS, compositionRows(C));
  setText("composition-note", `Sum ${fmtBytes(C.total_bytes)} of the ${fmtBytes(peak.memory_bytes)} peak;` +
    ` unattributed ${fmtBytes(C.unattributed_bytes)}. Each band is what one module created in one microbatch` +
    " and chunk, still live at the peak.");
}

function showActiveMemory(A) {
  if (!A || !A.bands.length) {
    document.getElementById("active").appendChild(el("p", {className: "muted"}, "No allocator history was recorded:" +
      " run with --memscope-enable-memory-snapshot to see memory through the peak step, band by band."));
    return;
  }
  plot("active", activeBands(A), activeLayout(A));
  setText("active-note", activeNote(A));
}

function showGpuSignals(S, notes) {
  if (notes.gpu_signals) {
    setText("gpu-note", notes.gpu_signals);
    return;
  }
  setText("gpu-note", "At each step's end: device used is cudaMemGetInfo's; outside PyTorch is device used minus" +
    " reserved (NCCL buffers, the CUDA context, other libraries); reserved − allocated is cached by the allocator" +
    " but free; retries and OOMs count since the step listed before.");
  table("gpu", GPU_COLUMNS, gpuRows(S));
}

function showLeak(l) {
  const li = el("li", {}, leakText(l)), ul = el("ul");
  (l.suspects || []).forEach(x => ul.appendChild(el("li", x.stack ? {title: x.stack.join("\n")} : {}, suspectText(x))));
  li.appendChild(ul);
  document.getElementById("leaks").appendChild(li);
}

function showTransitions(T, notes) {
  if (!T) {
    setText("transitions-summary", "Not in this report (written by an older MemScope).");
    return;
  }
  setText("transitions-summary", transitionsSummary(T));
  T.leaks.forEach(showLeak);
  table("transitions", transitionColumns(notes), transitionRows(T));
}

function setUpWithinStep(P) {
  const sel = document.getElementById("step-select"), colorBy = document.getElementById("color-by");
  const steps = withinSteps(P.within_step);
  steps.forEach(s => sel.appendChild(el("option", {value: s}, s)));
  if (P.peak && P.peak.step !== undefined && P.within_step[String(P.peak.step)]) sel.value = String(P.peak.step);
  if (steps.length < P.within_steps_total) {
    setText("within-note", ` ${steps.length} of ${P.within_steps_total} traced steps selectable (first, last, peak, evenly spread).`);
  }
  const draw = () => {
    const W = P.within_step[sel.value];
    if (!W) {
      setText("within", "No module or grad events were kept for any step.");
      return;
    }
    const M = P.within_peak && P.within_peak.step === sel.value ? P.within_peak : null;
    plot("within", withinTraces(W, colorBy.value), withinLayout(W, M));
  };
  sel.addEventListener("change", draw);
  colorBy.addEventListener("change", draw);
  draw();
}

function markPeakRow(events) {
  events.forEach((r, i) => {
    if (!r.is_peak) return;
    const tr = document.querySelectorAll("#top tr")[i + 1];
    tr.className = "peak-row";
    tr.title = "the run's peak was attributed here";
    tr.cells[1].textContent += " ← peak";
  });
}

function showStatic(comp) {
  const box = document.getElementById("static");
  if (comp.status !== "ok") {
    box.appendChild(el("p", {className: "muted"}, "Static estimate missing: " + (comp.reason || "unknown reason") + "."));
    return;
  }
  box.appendChild(el("table", {id: "static-table"}));
  table("static-table", STATIC_COLUMNS, staticRows(comp));
  box.appendChild(el("p", {className: "muted"},
    `A shortfall (static below runtime) is red when it is at least ${fmtRatio(RULES.alarm_ratio, true)} of the runtime peak.`));
}

function showPhases(phases) {
  if (phases.some(isLowerBound)) {
    setText("phase-bound-note", "; ≥ marks a phase that stayed below the mark set elsewhere in its step: its highest reading (a lower bound)");
  }
  table("phases", PHASE_COLUMNS, phaseRows(phases));
}

function showModules(modules, total) {
  table("modules", MODULE_COLUMNS, modules);
  searchable("mod-search", "modules");
  if (modules.length < total) setText("mod-note", `${modules.length} of ${total} modules shown (largest increase first).`);
}

// Each renderer takes the payload and the section's entry of its index ({name, title, renderer}).
const RANK_SECTIONS = {
  oom: P => {
    if (P.oom) showOom(P.oom);
  },
  peak: P => {
    showCards("cards", runtimeCards(P));
    showComposition(P.peak || {}, P.notes);
  },
  allocator_timeline: P => {
    showActiveMemory(P.active_memory);
    table("idle", IDLE_COLUMNS, idleRows(P.idle_at_peak));
  },
  comparisons: P => showStatic(P.comparisons || {}),
  phase_summary: P => showPhases(P.phase_summary),
  top_events: P => {
    table("top", TOP_COLUMNS, P.top_events);
    markPeakRow(P.top_events);
    searchable("top-search", "top");
  },
  module_summary: P => showModules(P.module_summary, P.modules_total),
  step_transitions: P => showTransitions(P.step_transitions, P.notes),
  steps: P => {
    plot("timeline", timelineTraces(P.steps, P.notes), layout("step", P.steps.step));
    showGpuSignals(P.steps, P.notes);
    setText("timeline-note", timelineNote(P.steps, P.steps_total));
    setUpWithinStep(P);
  },
};
