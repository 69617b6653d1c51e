// The rank page's cards, charts and rows (templates/js/runtime_view.js) from small payloads.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const {loadPageScripts} = require("./page_scripts.js");

const R = loadPageScripts(["runtime_view.js"]);
const MIB = 1048576;

function steps(used) {
  return {step: used.map((_, i) => i + 1), device_used_end: used, outside_pytorch_end: used.map(() => MIB),
    cached_free_end: used.map(() => 2 * MIB), alloc_retries: used.map(() => 0), ooms: used.map(() => 0)};
}

function payload(extra) {
  return Object.assign({
    peak: {memory_bytes: 23.35 * MIB, reserved_bytes: 32 * MIB, step: 1, phase: "backward", module: "output_layer",
      microbatch: 0, categories: {parameters: 4 * MIB, gradients: 0, activations: 19.35 * MIB}},
    comparisons: {status: "ok", static_peak_memory_bytes: 23.36 * MIB, static_source: "estimator",
      peak_diff_bytes: 0.01 * MIB, peak_diff_ratio: 0.0004},
    notes: {}, metadata: {backend: "cuda"}, steps: steps([10 * MIB, 30 * MIB, 30 * MIB, null]),
    gpu_totals: {alloc_retries_total: 2, ooms_total: null},
  }, extra);
}

test("the device-used card names the first step that used the most", () => {
  assert.equal(R.mostUsedStep([null, 5, 9, 9, 3]), 2);
  assert.equal(R.mostUsedStep([null, undefined]), -1);
  assert.equal(R.mostUsedStep([]), -1);
  const card = R.deviceUsedCard(steps([10 * MIB, 30 * MIB, 30 * MIB]), {alloc_retries_total: 2, ooms_total: null});
  assert.equal(card[1], "30.00 MiB");
  assert.match(card[2], /^step 2: outside PyTorch 1\.00 MiB, reserved − allocated 2\.00 MiB; 2 allocation retries, n\/a OOMs/);
  assert.deepEqual(R.deviceUsedCard(steps([null]), {}).slice(1), ["n/a", "no step read the device"]);
});

test("the cards: peak and where, reserved, static estimate and its difference, device, live categories", () => {
  const cards = R.runtimeCards(payload());
  assert.deepEqual(cards.map(c => c[0]), ["Peak allocated", "Peak reserved", "Static estimate", "Static − runtime",
    "Device used (most at a step end)", "Live at the peak"]);
  assert.deepEqual(cards[0], ["Peak allocated", "23.35 MiB", "step 1 · backward · output_layer · microbatch 0"]);
  assert.deepEqual(cards[1], ["Peak reserved", "32.00 MiB", "backend cuda"]);
  assert.deepEqual(cards[3], ["Static − runtime", "+10.24 KiB", "0.0%"]);
  assert.equal(cards[5][1], "parameters 4.00 MiB, activations 19.35 MiB");  // no zero categories
});

test("cards say what the backend cannot show and why the estimate is missing", () => {
  const notes = {reserved: "n/a — no caching allocator on CPU", gpu_signals: "Not available with the storage backend"};
  const cards = R.runtimeCards(payload({notes: notes, comparisons: {status: "missing", reason: "no model spec"}}));
  assert.deepEqual(cards[1], ["Peak reserved", "n/a", notes.reserved]);
  assert.deepEqual(cards[2], ["Static estimate", "missing", "no model spec"]);
  assert.deepEqual(cards[3], ["Static − runtime", "n/a", ""]);
  assert.deepEqual(cards[4], ["Device used", "n/a", notes.gpu_signals]);
});

test("composition: one bar band per item, labelled by module, phase, microbatch 0 and chunk 0", () => {
  const C = {items: [{category: "activations", bytes: 2 * MIB, module: "mlp", phase: "forward", microbatch: 0, virtual_chunk: 0, saved: true},
    {category: "parameters", bytes: MIB, module: null, phase: null, microbatch: null, virtual_chunk: null, saved: null}]};
  const bars = R.compositionBars(C);
  assert.deepEqual(bars.map(b => b.name), ["mlp · forward · microbatch 0 · chunk 0", "(no module)"]);
  assert.deepEqual(bars.map(b => b.y[0]), [2, 1]);
  assert.notEqual(bars[0].marker.color, bars[1].marker.color);
  assert.deepEqual(R.compositionRows(C).map(r => r.kept), ["saved", ""]);
  assert.deepEqual(R.compositionBars({items: []}), []);
});

test("active memory: bands stack, each category in the legend once, the peak marked at its sample", () => {
  const A = {time_us: [0, 1000, 2000, 3000], peak_index: 2, step: 1, events: 40, bands: [
    {category: "parameters", label: "weights", bytes: [MIB, MIB, MIB, MIB]},
    {category: "activations", label: "forward · mlp", bytes: [0, MIB, 3 * MIB, 0]},
    {category: "activations", label: "backward · mlp", bytes: [0, 0, MIB, MIB]}]};
  assert.deepEqual(R.stackTotals(A.time_us, A.bands), [MIB, 2 * MIB, 5 * MIB, 2 * MIB]);
  const bands = R.activeBands(A);
  assert.deepEqual(bands.map(b => b.showlegend), [true, true, false]);
  assert.deepEqual(bands[1].x, [0, 1, 2, 3]);  // ms
  assert.notEqual(bands[1].fillcolor, bands[2].fillcolor);
  const lay = R.activeLayout(A);
  assert.equal(lay.shapes[0].x0, 2);
  assert.equal(lay.annotations[0].y, 5);
  assert.equal(lay.annotations[0].text, "peak 5.00 MiB");
  assert.match(R.activeNote(A), /^Step 1: 4 samples of 40 allocator events .*, 3 bands\./);
  assert.match(R.activeNote(Object.assign({}, A, {step: null})), /^The whole recorded window: /);
});

test("the step timeline drops the lines the backend cannot read", () => {
  const S = steps([MIB]);
  Object.assign(S, {peak_allocated: [MIB], allocated_start: [0], allocated_end: [MIB], reserved_end: [MIB]});
  assert.equal(R.timelineTraces(S, {}).length, 5);
  const cpu = R.timelineTraces(S, {reserved: "no allocator", gpu_signals: "no device"});
  assert.deepEqual(cpu.map(t => t.name), ["peak allocated (high-water)", "allocated at step start", "allocated at step end"]);
  assert.equal(R.timelineNote({step: [1, 2, 3]}, 3), "");
  assert.equal(R.timelineNote({step: [1, 5, 9]}, 9), "3 of 9 steps plotted (min/max per bucket; the peak step is always kept).");
});

test("GPU rows are the steps that read the device", () => {
  const rows = R.gpuRows(steps([null, 3 * MIB, undefined, 0]));
  assert.deepEqual(rows.map(r => [r.step, r.device_used_end]), [[2, 3 * MIB], [4, 0]]);
  assert.deepEqual(R.gpuRows(steps([])), []);
});

test("step transitions: counts, how many are listed, leaks and their suspects", () => {
  const T = {counts: {steady: 2, new_steady_state: 1}, transitions: [{step: 2, kind: "new_steady_state"}],
    transitions_total: 3, tolerance: 0.01, leaks: []};
  assert.equal(R.transitionsSummary(T), "steady: 2, new steady state: 1 (1 of 3 changes listed). Leaks are judged on" +
    " allocated bytes only; moves within 1% of allocated are steady.");
  assert.equal(R.transitionRows(T)[0].kind, "new steady state");
  assert.equal(R.transitionColumns({}).length, 6);
  assert.ok(!R.transitionColumns({reserved: "n/a"}).some(c => c[0] === "reserved_delta"));
  const leak = {first_step: 2, last_step: 6, bytes_per_step: 4096, bytes_added: 16384};
  assert.equal(R.leakText(leak), "leak candidate, steps 2–6: allocated grew 4.00 KiB per step (16.00 KiB in all)");
  const suspect = {module: null, phase: "forward", microbatch: 0, bytes_per_step: 4096, birth_steps: [2, 3], stack: ["a.py:3"]};
  assert.equal(R.suspectText(suspect),
    "suspect (no module) (forward, microbatch 0): 4.00 KiB per step born in steps 2, 3, still live, created at a.py:3");
});

const W = {order: [0, 1, 2, 3, 4], microbatch: [0, 0, 1, 1, 0], phase: ["forward", "forward", "forward", "backward", "backward"],
  event_type: ["module_pre", "module_post", "module_post", "grad", "grad"], module: ["a", "b", null, "c", "d"],
  mem_allocated_after: [1, 5, 3, 4, 2].map(x => x * MIB), max_mem_allocated: [1, 5, 5, 5, 5].map(x => x * MIB),
  delta_allocated: [MIB, 4 * MIB, -2 * MIB, MIB, -2 * MIB]};

test("within one step: one marker trace per group, then the high-water mark", () => {
  const traces = R.withinTraces(W, "microbatch");
  assert.deepEqual(traces.map(t => t.name), ["microbatch 0", "microbatch 1", "high-water mark"]);
  assert.deepEqual(traces[0].x, [0, 1, 4]);
  assert.deepEqual(traces[1].y, [3, 4]);
  assert.equal(traces[0].text[1], "module_post b · microbatch 0 · 5.00 MiB (Δ +4.00 MiB)");
  assert.deepEqual(R.withinTraces(W, "phase").map(t => t.name), ["forward", "backward", "high-water mark"]);
  assert.deepEqual(R.withinSteps({10: 1, 2: 1, 1: 1}), ["1", "2", "10"]);
});

test("the step peak is the first event that reached the step's highest mark", () => {
  assert.deepEqual(R.withinPeak(W, null), {order: 1, bytes: 5 * MIB, label: "step peak 5.00 MiB · b"});
  const noModule = Object.assign({}, W, {module: [null, null, null, null, null]});
  assert.equal(R.withinPeak(noModule, null).label, "step peak 5.00 MiB · module_post");
  assert.equal(R.withinPeak(Object.assign({}, W, {max_mem_allocated: [null, null, null, null, null]}), null), null);
});

test("on the run's peak step the report's attributed peak is marked, named as the card names it", () => {
  const M = {step: "1", order: 3, bytes: 6 * MIB, phase: "backward", module: "c", microbatch: 0};
  assert.deepEqual(R.withinPeak(W, M), {order: 3, bytes: 6 * MIB, label: "run peak 6.00 MiB · backward · c · microbatch 0"});
  assert.equal(R.withinPeak(W, Object.assign({}, M, {module: null, microbatch: null})).label,
    "run peak 6.00 MiB · backward · (no module)");
  assert.equal(R.withinPeak(W, Object.assign({}, M, {order: 99})), null);  // not among the kept events
  assert.equal(R.withinLayout(W, M).shapes[0].x0, 3);
  assert.equal(R.withinLayout(W, Object.assign({}, M, {order: 99})).shapes, undefined);
});

test("a phase below its step's mark shows its highest reading as a lower bound", () => {
  const rows = R.phaseRows([{phase: "optimizer", max_mem_allocated: 40 * MIB, max_mem_allocated_source: "readings"},
    {phase: "forward", max_mem_allocated: 0, max_mem_allocated_source: "running_peak"}]);
  assert.deepEqual(rows.map(r => r.in_phase), ["≥ 40.00 MiB", "0 B"]);
});

test("static rows carry the runtime peak, so a shortfall of 1% is red", () => {
  const comp = {runtime_peak_memory_bytes: 100 * MIB, components: [{component: "activations", diff_bytes: -2 * MIB},
    {component: "parameters", diff_bytes: -0.5 * MIB}]};
  const rows = R.staticRows(comp);
  assert.deepEqual(rows.map(r => R.rowSpecs(R.STATIC_COLUMNS, r)[3].className), ["n neg", "n"]);
  assert.deepEqual(R.staticRows({}), []);
});

test("errors then warnings; metadata with the schema and tool versions; idle time in ms", () => {
  const P = {errors: [{site: "hook", count: 2, first_error: "boom"}], warnings: ["slow"],
    metadata: {backend: "storage"}, schema_version: "1.0", tool_version: "0.9"};
  assert.deepEqual(R.errorRows(P), [{kind: "error", site: "hook", count: 2, first_error: "boom"},
    {kind: "warning", first_error: "slow"}]);
  assert.deepEqual(R.metadataRows(P).map(r => r.key), ["backend", "schema_version", "tool_version"]);
  assert.equal(R.idleRows([{idle_us: 1540}])[0].idle_ms, "1.5");
  assert.deepEqual(R.idleRows([]), []);
});

test("an OOM is told as where, what was asked and held, the verdict and the trend", () => {
  const O = {where: {step: 4, phase: "forward", module: null, microbatch: 0}, requested_bytes: 2 * MIB,
    allocated_bytes: 78 * 1024 * MIB, cached_free_bytes: 0, verdict_reason: "the request exceeds free memory",
    trend: "rising", trend_reason: "grew every step"};
  assert.equal(R.oomSentence(O), "Step 4, forward, (no module), microbatch 0: requested 2.00 MiB with 78.00 GiB allocated" +
    " and 0 B cached free. the request exceeds free memory. Trend: rising (grew every step).");
});
