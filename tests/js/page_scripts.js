// Loads the pages' script files (memscope/reporters/templates/js/) the way a page runs them:
// concatenated in order into one strict-mode script, sharing one global scope, here a node vm
// context with no DOM. Only the pure files (format, tables' cell specs, charts, the *_view
// files) are loaded by the tests; the *_page files wire the DOM and are checked in chromium
// (tests/test_html_browser.py).
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const vm = require("node:vm");

const JS_DIR = path.join(__dirname, "..", "..", "memscope", "reporters", "templates", "js");
const SHARED = ["format.js", "tables.js", "charts.js", "sections.js"];
// Explicit rules, so each test states the rounding it expects (the page gets memscope/units.py's
// NUMBER_RULES; tests/test_pages_js.py checks those are what these tests assume by default).
const DEFAULT_RULES = {bytes_decimals: 2, percent_decimals: 1, alarm_ratio: 0.01};

// The results cross back from the vm's realm as plain values of this realm, so
// assert.deepStrictEqual compares them by value.
function plain(value) {
  return value === undefined ? undefined : structuredClone(value);
}

// The names the files declare, as functions of this realm: {fmtBytes, cellSpec, ...}.
// `files` are loaded after the shared ones; `rules` replaces DEFAULT_RULES.
function loadPageScripts(files, rules) {
  const context = vm.createContext({RULES: Object.assign({}, rules || DEFAULT_RULES)});
  const names = SHARED.concat(files || []);
  const source = '"use strict";\n' + names.map(n => fs.readFileSync(path.join(JS_DIR, n), "utf8")).join("\n");
  vm.runInContext(source, context, {filename: names.join("+")});
  return new Proxy({}, {
    get(_, name) {
      if (typeof name !== "string") return undefined;
      const value = vm.runInContext(name, context);
      return typeof value === "function" ? (...args) => plain(value(...args)) : plain(value);
    },
  });
}

module.exports = {loadPageScripts, DEFAULT_RULES, JS_DIR};
