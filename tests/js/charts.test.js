// Chart building blocks (templates/js/charts.js).
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const {loadPageScripts} = require("./page_scripts.js");

const C = loadPageScripts();
const MIB = 1048576;

test("series are plotted in MiB with gaps for what is not a byte count", () => {
  assert.deepEqual(C.mib([0, MIB, 1.5 * MIB, null, undefined, NaN, 2 ** 63]), [0, 1, 1.5, null, null, null, null]);
  assert.deepEqual(C.mib([]), []);
});

test("hover text is the formatted bytes, escaped for Plotly", () => {
  assert.deepEqual(C.hover([1536, null]), ["1.50 KiB", "n/a"]);
});

test("each category keeps one hue; its bands vary in lightness, cycling every five", () => {
  const hueOf = c => c.match(/^hsl\((\d+),/)[1];
  const light = c => c.match(/,(\d+)%\)$/)[1];
  assert.equal(hueOf(C.categoryColor("activations", 0)), hueOf(C.categoryColor("activations", 3)));
  assert.notEqual(light(C.categoryColor("activations", 0)), light(C.categoryColor("activations", 1)));
  assert.equal(C.categoryColor("activations", 0), C.categoryColor("activations", 5));
  assert.equal(C.categoryColor("gradients"), C.categoryColor("gradients", 0));
  const hues = C.CATEGORIES.map(c => hueOf(C.categoryColor(c)));
  assert.equal(new Set(hues).size, hues.length);
  assert.ok(!hues.includes(hueOf(C.categoryColor("not_a_category"))));
});

test("a step axis has integer ticks, every step when there are at most 20", () => {
  assert.equal(C.layout("step", [1, 2, 3]).xaxis.dtick, 1);
  assert.equal(C.layout("step", [1, 2, 3]).xaxis.tickformat, "d");
  const many = Array.from({length: 21}, (_, i) => i);
  assert.equal(C.layout("step", many).xaxis.dtick, undefined);
  assert.equal(C.layout("category").xaxis.tickformat, undefined);
  assert.deepEqual(C.layout("category").yaxis, {title: {text: "MiB"}, rangemode: "tozero"});
});

test("the peak marker is a dotted line at x and an arrow at the peak's height in MiB", () => {
  const mark = C.peakMarker(12.5, 3 * MIB, "peak <3.00 MiB>");
  assert.equal(mark.shapes[0].x0, 12.5);
  assert.equal(mark.shapes[0].x1, 12.5);
  assert.equal(mark.shapes[0].line.dash, "dot");
  assert.deepEqual([mark.annotations[0].x, mark.annotations[0].y], [12.5, 3]);
  assert.equal(mark.annotations[0].text, "peak &lt;3.00 MiB&gt;");
  assert.equal(C.peakMarker("<x>", 0, "").shapes[0].x0, "&lt;x&gt;");
});

test("grouped bars: one trace per series over the same names, each its own colour", () => {
  const bars = C.groupedBars(["a<1>", "b"], [{name: "A", values: [MIB, null]}, {name: "B", values: [0, 2 * MIB]}]);
  assert.equal(bars.length, 2);
  assert.deepEqual(bars[0].x, ["a&lt;1&gt;", "b"]);
  assert.deepEqual(bars[0].y, [1, null]);
  assert.deepEqual(bars[1].text, ["0 B", "2.00 MiB"]);
  assert.notEqual(bars[0].marker.color, bars[1].marker.color);
  assert.deepEqual(C.groupedBars([], [{name: "A", values: []}])[0].y, []);
});
