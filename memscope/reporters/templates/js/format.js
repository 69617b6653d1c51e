// Text and numbers as every page shows them. Pure functions; the one global they read is
// RULES, the number rules of memscope/units.py (NUMBER_RULES), which the page embeds.
//
// Rule: every string from the data that is handed to Plotly (trace names, hover text, tick
// labels, annotations) goes through plotlyText(): Plotly reads its text as pseudo-HTML
// (<a href>, <span style>, <br>), so & < > are escaped and the text shows as it is. Tables and
// cards are built with textContent only (never the HTML-parsing DOM properties).

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
// A byte count a report can hold: a finite number below 2**63 (the int64 the trackers count in).
const MAX_BYTES = 9223372036854775808;
// The place of a reading or allocation outside every module (NO_MODULE_LABEL of
// memscope/events/schema.py, the one spelling; tests/test_step_boundary.py compares them).
const NO_MODULE = "(no module)";

function plotlyText(v) {
  const text = v === null || v === undefined ? "" : String(v);
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function plotlyValues(values) {
  return values.map(v => (typeof v === "number" ? v : plotlyText(v)));
}

function plotlyMatrix(rows) {
  return rows.map(plotlyValues);
}

function finite(v) {
  return typeof v === "number" && isFinite(v) && Math.abs(v) < MAX_BYTES;
}

// The one rounding rule: toFixed rounds the exact value half away from zero, as the Markdown
// does; a value that shows as zero carries no sign.
function signed(digits, negative, plus) {
  if (!/[1-9]/.test(digits)) return digits;
  return (negative ? "-" : plus ? "+" : "") + digits;
}

function fmtBytes(v, plus) {
  if (v === null || v === undefined) return "n/a";
  if (!finite(v)) return "invalid";
  let size = Math.abs(v), u = 0;
  while (size >= 1024 && u < UNITS.length - 1) {
    size /= 1024;
    u++;
  }
  const digits = u === 0 ? String(Math.trunc(size)) : size.toFixed(RULES.bytes_decimals);
  return signed(digits, v < 0, plus) + " " + UNITS[u];
}

// A ratio as a percentage, signed unless `plain`.
function fmtRatio(v, plain) {
  if (v === null || v === undefined) return "n/a";
  if (!finite(v)) return "invalid";
  return signed(Math.abs(v * 100).toFixed(RULES.percent_decimals), v < 0, !plain) + "%";
}

// Alarm colour only for a shortfall of at least RULES.alarm_ratio of what it is compared with.
function alarming(v, reference) {
  if (!finite(v) || !finite(reference) || v >= 0) return false;
  return Math.abs(v) >= RULES.alarm_ratio * Math.abs(reference);
}

// "a · b · c" from the parts that are there.
function joinParts(parts) {
  return parts.filter(Boolean).join(" · ");
}

function microbatchText(microbatch) {
  return microbatch === null || microbatch === undefined ? null : "microbatch " + microbatch;
}

// Where something happened: "step 3 · backward · decoder.layers.1 · microbatch 0".
function momentText(m) {
  return joinParts(["step " + m.step, m.phase, m.module || null, microbatchText(m.microbatch)]);
}

// "some_kind" -> "some kind"
function spaced(name) {
  return String(name).replace(/_/g, " ");
}
