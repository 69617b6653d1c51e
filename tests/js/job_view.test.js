// The job page's cards, grid and rows (templates/js/job_view.js) from small payloads.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const {loadPageScripts} = require("./page_scripts.js");

const J = loadPageScripts(["job_view.js"]);
const MIB = 1048576;

test("job cards: ranks, the heaviest rank and the imbalance; out of memory first; headroom 0 is shown", () => {
  const payload = {world_size: 4, missing: 1, incomplete: 0,
    imbalance: {max_rank: 2, max_bytes: 30 * MIB, max_pp_rank: 1, max_tp_rank: null, ratio: 1.5, min_rank: 0, min_bytes: 20 * MIB},
    oom: {ranks: [{rank: 3, verdict: "true", where: {step: 2, phase: "backward", module: null}}, {rank: 1, where: null}],
      tightest_headroom: 0, tightest_rank: 2, ranks_with_headroom: 3}};
  const cards = J.jobCards(payload);
  assert.deepEqual(cards.map(c => c[0]), ["Out of memory", "Ranks", "Heaviest rank", "Imbalance max / min", "Tightest headroom"]);
  assert.deepEqual(cards[0], ["Out of memory", "2 rank(s)", "rank 3 (true): step 2, backward, (no module); rank 1 (?): ?"]);
  assert.deepEqual(cards[1], ["Ranks", "4", "1 missing, 0 incomplete"]);
  assert.deepEqual(cards[2], ["Heaviest rank", "rank 2", "30.00 MiB (pp 1, tp ?)"]);
  assert.deepEqual(cards[3], ["Imbalance max / min", "1.500×", "rank 0: 20.00 MiB"]);
  assert.deepEqual(cards[4], ["Tightest headroom", "0 B", "rank 2, of 3 rank(s) with a known device size"]);
  assert.deepEqual(J.jobCards({world_size: 0, missing: 0, incomplete: 0}).map(c => c[0]), ["Ranks"]);
});

test("a stage's terms: those holding bytes, largest first", () => {
  assert.equal(J.termsText({parameters: MIB, activations: 3 * MIB, gradients: 0}), "activations 3.00 MiB, parameters 1.00 MiB");
  assert.equal(J.termsText(undefined), "");
  const rows = J.stageRows([{pp_rank: 0, max_terms: {activations: MIB}, max_predicted_terms: null, in_flight_measured: 2}]);
  assert.equal(rows[0].acts, "1.00 MiB / n/a");
  assert.equal(rows[0].flight, "2 / ?");
  assert.deepEqual(J.stageRows(undefined), []);
});

test("rank rows link to the rank's page, fold a run of missing ranks, and name another run", () => {
  assert.deepEqual(J.rankRow({rank: 0, page: "rank00000/runtime_report.html", status: "complete"}).rank,
    {label: 0, href: "rank00000/runtime_report.html"});
  assert.equal(J.rankRow({rank: 0, status: "complete"}).rank, 0);
  assert.equal(J.rankRow({rank: 2, last_rank: 5, status: "missing", page: "x.html"}).rank, "2–5");
  assert.equal(J.rankRow({rank: 1, status: "complete", other_run: true, run_id: "r2"}).status, "complete (other run: r2)");
  const cells = J.rowSpecs(J.RANK_COLUMNS, J.rankRow({rank: 0, page: "rank00000/runtime_report.html", peak_allocated: 100 * MIB,
    static_diff: -2 * MIB, static_ratio: -0.02}));
  assert.equal(cells[0].href, "rank00000/runtime_report.html");
  assert.equal(cells[11].className, "n neg");
  assert.equal(cells[12].text, "-2.0%");
});

test("the rank grid puts each rank's peak in its stage and column; empty cells stay empty", () => {
  const G = {stages: [0, 1], columns: ["dp0", "dp<1>"], cells: [[0, 0, 0, 2 * MIB], [1, 1, 3, MIB]]};
  const heat = J.gridHeatmap(G);
  assert.deepEqual(heat.z, [[2, null], [null, 1]]);
  assert.deepEqual(heat.text, [["rank 0: 2.00 MiB", ""], ["", "rank 3: 1.00 MiB"]]);
  assert.deepEqual(heat.x, ["dp0", "dp&lt;1&gt;"]);
  assert.deepEqual(heat.y, ["stage 0", "stage 1"]);
  assert.equal(J.gridLayout(G).height, 200);
  assert.equal(J.gridLayout({stages: Array.from({length: 64}, (_, i) => i)}).height, 600);
});

test("one timeline per rank of the chosen series; the note says when not every rank is plotted", () => {
  const timelines = {0: {step: [1, 2], peak_allocated: [MIB, 2 * MIB], reserved_end: [null, null]}, 3: {step: [1, 2], peak_allocated: [MIB, MIB], reserved_end: [MIB, MIB]}};
  const lines = J.rankTimelines(timelines, "peak_allocated");
  assert.deepEqual(lines.map(l => l.name), ["rank 0", "rank 3"]);
  assert.deepEqual(lines[0].y, [1, 2]);
  assert.deepEqual(J.rankTimelines(timelines, "reserved_end")[0].y, [null, null]);
  assert.deepEqual(J.rankTimelines({}, "peak_allocated"), []);
  assert.equal(J.timelinesNote({timelines: timelines, timelines_total: 2}), "");
  assert.match(J.timelinesNote({timelines: timelines, timelines_total: 64}), /^2 of 64 ranks plotted: /);
});
