// The job page's wiring: puts job_view.js's cards, charts and rows into the page.

function setUpTimelines(J) {
  const series = document.getElementById("series"), first = Object.values(J.timelines)[0];
  setText("timelines-note", timelinesNote(J));
  const draw = () => plot("timelines", rankTimelines(J.timelines, series.value), layout("step", first ? first.step : []));
  series.addEventListener("change", draw);
  draw();
}

function showJobPage(J) {
  showCards("cards", jobCards(J));
  setText("stage-imbalance", (J.imbalance_by_term || {}).sentence || "");
  table("stages", STAGE_COLUMNS, stageRows(J.stages));
  table("outliers", OUTLIER_COLUMNS, J.outliers || []);
  const G = J.grid || {};
  if (G.cells && G.cells.length) plot("grid", [gridHeatmap(G)], gridLayout(G));
  table("ranks", RANK_COLUMNS, J.ranks.map(rankRow));
  setUpTimelines(J);
}

showJobPage(DATA);
