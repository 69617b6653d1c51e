// Rules for every page script file (templates/js/*.js): short lines, names unique across the
// files (a page runs them in one scope), and the DOM only ever given text.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const {JS_DIR} = require("./page_scripts.js");

const FILES = fs.readdirSync(JS_DIR).filter(n => n.endsWith(".js")).sort();

function lines(name) {
  return fs.readFileSync(path.join(JS_DIR, name), "utf8").split("\n");
}

test("there are page scripts to check", () => {
  for (const name of ["format.js", "tables.js", "charts.js", "runtime_page.js", "job_page.js"]) assert.ok(FILES.includes(name), name);
});

test("no line of the pages' script is over 200 characters", () => {
  const long = FILES.flatMap(n => lines(n).map((l, i) => [n + ":" + (i + 1), l.length]).filter(e => e[1] > 200));
  assert.deepEqual(long, []);
});

test("every top-level name is declared once across all the files", () => {
  const seen = {};
  for (const name of FILES) {
    for (const line of lines(name)) {
      const m = line.match(/^(?:function|const|let|class)\s+([A-Za-z_$][\w$]*)/);
      if (m) (seen[m[1]] = seen[m[1]] || []).push(name);
    }
  }
  const twice = Object.entries(seen).filter(e => e[1].length > 1);
  assert.deepEqual(twice, []);
  assert.ok(Object.keys(seen).length > 50);
});

test("the script never parses data as HTML and never closes its own element", () => {
  const sinks = /innerHTML|outerHTML|insertAdjacentHTML|document\.write|<\/script|<!--/i;
  const found = FILES.flatMap(n => lines(n).map((l, i) => [n + ":" + (i + 1), l]).filter(e => sinks.test(e[1]) && !/^\s*\/\//.test(e[1])));
  assert.deepEqual(found, []);
});
