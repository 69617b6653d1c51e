// The rank page's section renderers (templates/js/runtime_sections.js): the registry keyed by
// renderer name and the dispatch that follows the report's sections index.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const {loadPageScripts} = require("./page_scripts.js");

const S = loadPageScripts(["runtime_view.js", "runtime_sections.js"]);
const BUILT_IN = ["oom", "peak", "allocator_timeline", "comparisons", "phase_summary", "top_events", "module_summary",
  "step_transitions", "steps"];

test("the registry has a function for every built-in section's renderer", () => {
  // functions cannot cross the realms: ask the page's scope for their names and types
  const kinds = S["Object.entries(RANK_SECTIONS).map(e => [e[0], typeof e[1]])"];
  assert.deepEqual(kinds.map(k => k[0]).sort(), BUILT_IN.slice().sort());
  assert.ok(kinds.every(k => k[1] === "function"));
});

test("sections are drawn in the index's order, each by the renderer its entry names, with its entry", () => {
  const calls = [];
  const registry = {
    steps: (P, s) => calls.push(["steps", s.name, P.tag]),
    peak: (P, s) => calls.push(["peak", s.name, P.tag]),
  };
  const sections = [
    {name: "steps", title: "Steps", renderer: "steps"},
    {name: "toy", title: "Toy", layout: "table", rows: [["1"]]},  // generic: its markup only
    {name: "peak", title: "Peak", renderer: "peak"},
    {name: "peak_again", title: "Peak again", renderer: "peak"},  // one renderer may draw two sections
  ];
  S.drawSections({tag: "P", sections: sections}, registry);
  assert.deepEqual(calls, [["steps", "steps", "P"], ["peak", "peak", "P"], ["peak", "peak_again", "P"]]);
});

test("a section whose renderer has no function, or that names none, is left to its markup", () => {
  const registry = {peak: () => 1};
  const entries = [{name: "a", renderer: "partial_only"}, {name: "b"}, {name: "c", renderer: "peak"}, {name: "d", renderer: 7}];
  assert.deepEqual(S.sectionsToDraw(entries, registry).map(s => s.name), ["c"]);
  assert.deepEqual(S.sectionsToDraw(undefined, registry), []);
  // the names every object inherits are no renderers
  const inherited = [{name: "x", renderer: "toString"}, {name: "y", renderer: "constructor"}, {name: "z", renderer: "__proto__"}];
  assert.deepEqual(S.sectionsToDraw(inherited, registry), []);
});

test("with no sections, nothing is drawn", () => {
  let called = 0;
  S.drawSections({}, {peak: () => called++});
  S.drawSections({sections: []}, {peak: () => called++});
  assert.equal(called, 0);
});
