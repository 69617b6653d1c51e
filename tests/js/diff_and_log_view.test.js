// The diff page's and the training-log page's content (templates/js/diff_view.js, log_view.js).
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const {loadPageScripts} = require("./page_scripts.js");

const V = loadPageScripts(["diff_view.js", "log_view.js"]);
const MIB = 1048576;

test("diff cards: both peaks where they were and B − A signed", () => {
  const d = {peak: {a_bytes: 2 * MIB, b_bytes: MIB, delta_bytes: -MIB, moved: {},
    a_moment: {step: 1, phase: "forward", module: "m", microbatch: 0}, b_moment: {step: 1, phase: "forward", module: "m", microbatch: 0}}};
  assert.deepEqual(V.diffCards(d), [["Peak A", "2.00 MiB", "step 1 · forward · m · microbatch 0"],
    ["Peak B", "1.00 MiB", "step 1 · forward · m · microbatch 0"], ["B − A", "-1.00 MiB", "same moment"]]);
  d.peak.moved = {step: [1, 2]};
  assert.equal(V.diffCards(d)[2][2], "the peak moved");
});

test("a diff row's microbatches: one list when A and B agree, A's → B's when not", () => {
  assert.equal(V.microbatchesText({microbatch: 3}), 3);
  assert.equal(V.microbatchesText({microbatches_a: [0, 1], microbatches_b: [0, 1]}), "0,1");
  assert.equal(V.microbatchesText({microbatches_a: [0], microbatches_b: []}), "0 → —");
  assert.equal(V.diffRows({rows: [{microbatches_a: [], microbatches_b: [2]}]})[0].mb, "— → 2");
});

test("the diff note explains layouts, missing composition and summing over microbatches", () => {
  const layout = {same: false, a: "tp1pp2", b: "tp2pp1"};
  assert.equal(V.diffNote({layout: layout, composition: {available: false, reason: "no composition"}}),
    "Different parallel layouts: A is tp1pp2, B is tp2pp1; the ranks hold different shards. No comparison of what was live: no composition.");
  assert.equal(V.diffNote({composition: {available: true, over_microbatches: true, moved_between_microbatches: 2}}),
    "The live microbatches differ between A and B: items are summed over microbatches (A's → B's); 2 more only moved between microbatches.");
  assert.equal(V.diffNote({layout: {same: true}, composition: {available: true}}), "");
});

test("diff step rows: totals, phase peaks, categories at the end, in that order", () => {
  const s = {a_step: 1, b_step: 3, totals: {peak: {a: 1, b: 2, delta: 1}}, phase_peaks: {forward: {a: 0, b: 0, delta: 0}},
    categories_end: {}};
  assert.deepEqual(V.stepRows(s).map(r => r.what), ["totals: peak", "phase peaks: forward"]);
  assert.equal(V.stepColumns(s)[0][1], "step 1 (A) vs step 3 (B)");
  assert.deepEqual(V.stepRows(null), []);
  assert.equal(V.stepColumns(null)[0][1], "no step given");
});

test("category bars of a diff: A and B side by side over the same categories", () => {
  const pair = {a: "run1", b: "run<2>", diff: {composition: {by_category: {activations: {a: MIB, b: 2 * MIB}, parameters: {a: MIB, b: MIB}}}}};
  const bars = V.categoryBars(pair);
  assert.deepEqual(bars.map(b => b.name), ["A: run1", "B: run&lt;2&gt;"]);
  assert.deepEqual(bars[1].y, [2, 1]);
});

test("log bars: each stage's heaviest rank, then each OOM as held + requested", () => {
  const run = {stages: [{pp_rank: 0, rank: 1, measured_max_allocated_bytes: 3 * MIB, predicted_max_allocated_bytes: 2 * MIB}],
    ooms: [{rank: null, sizes: {allocated: MIB, requested: MIB}, estimate: {peak_bytes: 4 * MIB}},
      {rank: 5, sizes: {}, estimate: {peak_bytes: null}}]};
  const bars = V.logBars(run);
  assert.deepEqual(bars.map(b => b.name), ["stage 0 (rank 1)", "OOM, rank ?: allocated + request", "OOM, rank 5: allocated + request"]);
  assert.deepEqual(bars.map(b => b.measured), [3 * MIB, 2 * MIB, 0]);
  const traces = V.logStageTraces(bars);
  assert.deepEqual(traces.map(t => t.name), ["measured", "predicted"]);
  assert.deepEqual(traces[1].y, [2, 4, null]);
  assert.deepEqual(V.logStageTraces([]).map(t => t.x), [[], []]);
});

test("log sections: only index entries whose renderer the registry has are called, in index order", () => {
  const registry = {log_stages: 1, other: 2};
  const entries = [{name: "configuration", title: "Configuration", layout: "key_values", rows: []},
    {name: "stages", title: "Stages", renderer: "log_stages", value: []},
    {name: "toy", title: "Toy", renderer: "not_on_this_page"},
    {name: "extra", title: "Extra", renderer: "other"}];
  assert.deepEqual(V.scriptedSections(entries, registry).map(e => e.name), ["stages", "extra"]);
  assert.deepEqual(V.scriptedSections(entries, {}), []);
  assert.deepEqual(V.scriptedSections([{name: "x", renderer: "toString"}], {}), []);
  assert.equal(V.runPrefix(2), "run2-");
});
