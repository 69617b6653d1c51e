// What table cells show (templates/js/tables.js): cellSpec, rowSpecs, filters.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const {loadPageScripts} = require("./page_scripts.js");

const T = loadPageScripts();

test("byte cells are right-aligned and formatted; deltas are signed", () => {
  assert.deepEqual(T.cellSpec(1536, "bytes"), {className: "n", text: "1.50 KiB"});
  assert.deepEqual(T.cellSpec(1536, "delta"), {className: "n", text: "+1.50 KiB"});
  assert.deepEqual(T.cellSpec(null, "bytes"), {className: "n", text: "n/a"});
  assert.deepEqual(T.cellSpec(0.05, "ratio"), {className: "n", text: "+5.0%"});
});

test("a delta is red only when it is a shortfall of at least 1% of its reference", () => {
  assert.equal(T.cellSpec(-2048, "delta", 100000).className, "n neg");
  assert.equal(T.cellSpec(-512, "delta", 100000).className, "n");
  assert.equal(T.cellSpec(-2048, "delta").className, "n");  // no reference, no alarm
  assert.equal(T.cellSpec(-2048, "bytes", 100000).className, "n");  // only deltas alarm
});

test("links: relative ones are links, anything a browser would read as remote or script is text", () => {
  assert.deepEqual(T.cellSpec({label: 0, href: "rank00000/runtime_report.html"}, "link"),
    {className: "", text: "0", href: "rank00000/runtime_report.html"});
  assert.equal(T.cellSpec({label: 1, href: "../job_report.html"}, "link").href, "../job_report.html");
  for (const href of ["javascript:alert(1)", "JavaScript:x", "https://example.com/", "//example.com/x", "\\\\host\\x",
    "/\\host", " javascript:alert(1)", "java\tscript:alert(1)", "\u0001data:text/html,x", ""]) {
    assert.deepEqual(T.cellSpec({label: "r", href: href}, "link"), {className: "", text: "r"}, JSON.stringify(href));
  }
  assert.deepEqual(T.cellSpec({label: 3}, "link"), {className: "", text: "3"});
  assert.deepEqual(T.cellSpec("3–5", "link"), {className: "", text: "3–5"});  // a run of missing ranks
});

test("plain cells show the value as text and a dash for nothing, but 0 and false as they are", () => {
  assert.equal(T.cellSpec(null).text, "—");
  assert.equal(T.cellSpec(undefined).text, "—");
  assert.equal(T.cellSpec("").text, "—");
  assert.equal(T.cellSpec(0).text, "0");
  assert.equal(T.cellSpec(false).text, "false");
  assert.equal(T.cellSpec("<b>x</b>").text, "<b>x</b>");  // textContent shows it as text
});

test("a row's cells follow the columns, a delta judged against the row's reference column", () => {
  const columns = [["name", "name"], ["peak", "peak", "bytes"], ["diff", "Δ", "delta", "peak"]];
  const specs = T.rowSpecs(columns, {name: "rank 0", peak: 100 * 1024, diff: -4096});
  assert.deepEqual(specs, [{className: "", text: "rank 0"}, {className: "n", text: "100.00 KiB"},
    {className: "n neg", text: "-4.00 KiB"}]);
  assert.deepEqual(T.rowSpecs(columns, {}).map(s => s.text), ["—", "n/a", "n/a"]);
});

test("the filter keeps rows containing the query, ignoring case", () => {
  assert.equal(T.rowMatches("decoder.layers.1.MLP", "mlp"), true);
  assert.equal(T.rowMatches("decoder.layers.1.mlp", "Attention"), false);
  assert.equal(T.rowMatches("anything", ""), true);
});

test("key/value rows show objects as JSON and keep scalars", () => {
  assert.deepEqual(T.keyValueRows({backend: "storage", grid: {tp: 1}, none: null, n: 0}), [
    {key: "backend", value: "storage"}, {key: "grid", value: '{"tp":1}'}, {key: "none", value: null}, {key: "n", value: 0},
  ]);
});
