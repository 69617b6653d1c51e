// The training-log page's wiring: one run at a time, chosen in the run selector. The template
// lays out each run's sections from the report's sections index; a section whose spec names a
// renderer is drawn by its function in LOG_SECTIONS, (run, entry, id prefix) -> void, when its
// run is first shown (a chart drawn hidden would have no size).

const LOG_SECTIONS = {
  log_stages(run, entry, prefix) {
    const id = prefix + "stages-chart", bars = logBars(run);
    if (!bars.length) {
      document.getElementById(id).appendChild(el("p", {className: "muted"}, "no memory line and no out-of-memory message in this run"));
      return;
    }
    plot(id, logStageTraces(bars), Object.assign(layout("pipeline stage"), {barmode: "group"}));
  },
};

function showLogPage(D) {
  const sel = document.getElementById("run"), drawn = new Set();
  D.runs.forEach((r, i) => sel.appendChild(el("option", {value: String(i)}, "run " + (r.index + 1))));
  const draw = () => {
    const i = Number(sel.value);
    D.runs.forEach((r, j) => { document.getElementById("run-" + j).hidden = j !== i; });
    if (drawn.has(i)) return;
    drawn.add(i);
    scriptedSections(D.run_sections[i], LOG_SECTIONS).forEach(e => LOG_SECTIONS[e.renderer](D.runs[i], e, runPrefix(i)));
  };
  sel.addEventListener("change", draw);
  draw();
}

showLogPage(DATA);
