// The training-log page's wiring: one run at a time, chosen in the run selector.

function drawStages(run) {
  const bars = logBars(run);
  setText("stages-note", bars.length ? "" : "no memory line and no out-of-memory message in this run");
  document.getElementById("stages").style.display = bars.length ? "" : "none";
  if (bars.length) plot("stages", logStageTraces(bars), Object.assign(layout("pipeline stage"), {barmode: "group"}));
}

function drawOoms(run) {
  const ooms = document.getElementById("ooms");
  ooms.textContent = "";
  if (!run.ooms.length) ooms.appendChild(el("p", {className: "muted"}, "none in this run"));
  run.ooms.forEach((o, i) => {
    ooms.appendChild(el("div", {className: "banner bad"}, oomText(o)));
    ooms.appendChild(el("p", {}, oomEstimateText(o)));
    const t = el("table", {id: "oom-remedies-" + i});
    ooms.appendChild(t);
    table(t.id, LOG_REMEDY_COLUMNS, logRemedyRows(o));
  });
}

function drawNotes(run) {
  const notes = document.getElementById("notes");
  notes.textContent = "";
  run.notes.forEach(n => notes.appendChild(el("li", {}, n)));
  if (!run.notes.length) notes.appendChild(el("li", {className: "muted"}, "none"));
}

function showLogPage(D) {
  const sel = document.getElementById("run");
  D.runs.forEach((r, i) => sel.appendChild(el("option", {value: String(i)}, "run " + (r.index + 1))));
  const draw = () => {
    const run = D.runs[Number(sel.value)];
    setText("config", configText(run.config));
    const err = document.getElementById("error");
    err.textContent = "";
    if (run.error) err.appendChild(el("div", {className: "banner bad"}, "Not explained: " + run.error));
    drawStages(run);
    table("ranks", LOG_RANK_COLUMNS, logRankRows(run));
    drawOoms(run);
    drawNotes(run);
  };
  sel.addEventListener("change", draw);
  draw();
}

showLogPage(DATA);
