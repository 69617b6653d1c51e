// Text and numbers (templates/js/format.js): the rules the Markdown follows too.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const {loadPageScripts} = require("./page_scripts.js");

const F = loadPageScripts();
const KIB = 1024, MIB = 1024 * 1024;

test("bytes below a KiB are whole bytes, zero included", () => {
  assert.equal(F.fmtBytes(0), "0 B");
  assert.equal(F.fmtBytes(1), "1 B");
  assert.equal(F.fmtBytes(1023), "1023 B");
  assert.equal(F.fmtBytes(1023.9), "1023 B");
});

test("bytes take the largest unit below them with the rules' decimals", () => {
  assert.equal(F.fmtBytes(KIB), "1.00 KiB");
  assert.equal(F.fmtBytes(1536), "1.50 KiB");
  assert.equal(F.fmtBytes(23.35 * MIB), "23.35 MiB");
  assert.equal(F.fmtBytes(80 * 1024 * MIB), "80.00 GiB");
  assert.equal(F.fmtBytes(3 * 1024 ** 4), "3.00 TiB");
});

test("huge byte counts stay in PiB and past int64 are invalid", () => {
  assert.equal(F.fmtBytes(2 ** 62), "4096.00 PiB");
  assert.equal(F.fmtBytes(2 ** 63), "invalid");
  assert.equal(F.fmtBytes(Infinity), "invalid");
  assert.equal(F.fmtBytes(NaN), "invalid");
  assert.equal(F.fmtBytes("12"), "invalid");
  assert.equal(F.fmtBytes(null), "n/a");
  assert.equal(F.fmtBytes(undefined), "n/a");
});

test("an exact half rounds away from zero, on both signs", () => {
  assert.equal(F.fmtBytes(1152), "1.13 KiB");  // 1.125 KiB
  assert.equal(F.fmtBytes(-1152), "-1.13 KiB");
});

test("signed bytes: plus on request, no sign on what shows as zero", () => {
  assert.equal(F.fmtBytes(-1536), "-1.50 KiB");
  assert.equal(F.fmtBytes(1536, true), "+1.50 KiB");
  assert.equal(F.fmtBytes(0, true), "0 B");
  assert.equal(F.fmtBytes(-0.4, true), "0 B");
});

test("the rules' decimals are the ones used", () => {
  const coarse = loadPageScripts([], {bytes_decimals: 0, percent_decimals: 0, alarm_ratio: 0.5});
  assert.equal(coarse.fmtBytes(1536), "2 KiB");
  assert.equal(coarse.fmtRatio(0.0123), "+1%");
});

test("ratios are percentages, signed unless plain, never -0.0%", () => {
  assert.equal(F.fmtRatio(0.0123), "+1.2%");
  assert.equal(F.fmtRatio(-0.0123), "-1.2%");
  assert.equal(F.fmtRatio(0.0123, true), "1.2%");
  assert.equal(F.fmtRatio(-0.0004), "0.0%");
  assert.equal(F.fmtRatio(0), "0.0%");
  assert.equal(F.fmtRatio(null), "n/a");
  assert.equal(F.fmtRatio(-Infinity), "invalid");
});

test("only a shortfall of at least alarm_ratio of the reference is alarming", () => {
  assert.equal(F.alarming(-2, 100), true);
  assert.equal(F.alarming(-1, 100), true);  // exactly 1%
  assert.equal(F.alarming(-0.5, 100), false);
  assert.equal(F.alarming(50, 100), false);  // an excess is no alarm
  assert.equal(F.alarming(-2, -100), true);
  assert.equal(F.alarming(-2, null), false);
  assert.equal(F.alarming(0, 0), false);  // nothing short of nothing
  assert.equal(F.alarming(null, 100), false);
});

test("text for Plotly has & < > escaped and numbers left as numbers", () => {
  assert.equal(F.plotlyText('<a href="x">&</a>'), '&lt;a href="x"&gt;&amp;&lt;/a&gt;');
  assert.equal(F.plotlyText(null), "");
  assert.equal(F.plotlyText(0), "0");
  assert.deepEqual(F.plotlyValues([1.5, "<b>", null]), [1.5, "&lt;b&gt;", ""]);
  assert.deepEqual(F.plotlyMatrix([["a&b", 2]]), [["a&amp;b", 2]]);
});

test("a moment names step, phase, module and microbatch, microbatch 0 included", () => {
  const m = {step: 3, phase: "backward", module: "decoder.layers.1", microbatch: 0};
  assert.equal(F.momentText(m), "step 3 · backward · decoder.layers.1 · microbatch 0");
  assert.equal(F.momentText({step: 1, phase: "optimizer", module: null, microbatch: null}), "step 1 · optimizer");
  assert.equal(F.spaced("new_steady_state"), "new steady state");
});
