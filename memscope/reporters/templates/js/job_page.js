// The job page's wiring: draws its sections index in order (sections.js), each from
// job_view.js's cards, charts and rows.

function setUpTimelines(J) {
  const series = document.getElementById("series"), first = Object.values(J.timelines)[0];
  setText("timelines-note", timelinesNote(J));
  const draw = () => plot("timelines", rankTimelines(J.timelines, series.value), layout("step", first ? first.step : []));
  series.addEventListener("change", draw);
  draw();
}

// The job page's section renderers, by the names of its index (JOB_PAGE_SECTIONS in
// memscope/reporters/html_payload.py): each fills its partial, templates/sections/job/<name>.html.j2.
const JOB_SECTIONS = {
  cards: J => showCards("cards", jobCards(J)),
  stages: J => {
    setText("stage-imbalance", (J.imbalance_by_term || {}).sentence || "");
    table("stages", STAGE_COLUMNS, stageRows(J.stages));
  },
  grid: J => {
    const G = J.grid || {};
    if (G.cells && G.cells.length) plot("grid", [gridHeatmap(G)], gridLayout(G));
  },
  outliers: J => table("outliers", OUTLIER_COLUMNS, J.outliers || []),
  ranks: J => table("ranks", RANK_COLUMNS, J.ranks.map(rankRow)),
  timelines: setUpTimelines,
};

drawSections(DATA, JOB_SECTIONS);
