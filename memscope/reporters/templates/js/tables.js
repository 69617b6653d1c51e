// Tables, cards and filters. A table is described by columns [key, header, kind, reference]:
// kind "bytes", "delta" (signed bytes, red when alarming against row[reference]), "ratio",
// "link" ({label, href}: relative links only, no scheme and no "//host") or none (the value as
// text). What a cell shows is computed by cellSpec (pure); table() only puts it into the DOM.

const URL_SCHEME = /^[a-z][a-z0-9+.-]*:/i;
const NETWORK_PATH = /^[\\/]{2}/;

// An href as a browser reads it (the URL standard): tabs and newlines dropped anywhere, controls
// and spaces trimmed at both ends, so " java\tscript:" is read as "javascript:".
function hrefAsRead(href) {
  return href.replace(/[\t\n\r]/g, "").replace(/^[\u0000-\u0020]+|[\u0000-\u0020]+$/g, "");
}

function isRelativeLink(v) {
  if (!v || typeof v.href !== "string") return false;
  const href = hrefAsRead(v.href);
  return href !== "" && !URL_SCHEME.test(href) && !NETWORK_PATH.test(href);
}

function plainText(v) {
  return v === null || v === undefined || v === "" ? "—" : String(v);
}

// {className, text, href?}: what one cell shows.
function cellSpec(v, kind, reference) {
  if (kind === "bytes" || kind === "delta") {
    const alarm = kind === "delta" && alarming(v, reference);
    return {className: alarm ? "n neg" : "n", text: fmtBytes(v, kind === "delta")};
  }
  if (kind === "ratio") return {className: "n", text: fmtRatio(v)};
  if (kind === "link" && isRelativeLink(v)) return {className: "", text: String(v.label), href: v.href};
  if (kind === "link" && v && typeof v === "object") return {className: "", text: String(v.label)};
  return {className: "", text: plainText(v)};
}

function rowSpecs(columns, row) {
  return columns.map(c => cellSpec(row[c[0]], c[2], c[3] ? row[c[3]] : undefined));
}

// Whether a row whose text is `text` stays shown under the filter `query` (case-insensitive).
function rowMatches(text, query) {
  return String(text).toLowerCase().includes(String(query).toLowerCase());
}

// Plain object rows from a key -> value map ({key, value}), objects shown as JSON.
function keyValueRows(map) {
  return Object.entries(map).map(([key, value]) => {
    const shown = typeof value === "object" && value !== null ? JSON.stringify(value) : value;
    return {key: key, value: shown};
  });
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  Object.assign(e, attrs || {});
  if (text !== undefined) e.textContent = text;
  return e;
}

function cellElement(spec) {
  const td = el("td", spec.className ? {className: spec.className} : {});
  if (spec.href !== undefined) td.appendChild(el("a", {href: spec.href}, spec.text));
  else td.textContent = spec.text;
  return td;
}

function table(id, columns, rows) {
  const t = document.getElementById(id);
  t.textContent = "";
  const head = el("tr");
  columns.forEach(c => head.appendChild(el("th", {}, c[1])));
  t.appendChild(head);
  rows.forEach(r => {
    const tr = el("tr");
    rowSpecs(columns, r).forEach(spec => tr.appendChild(cellElement(spec)));
    t.appendChild(tr);
  });
  if (!rows.length) {
    const tr = el("tr");
    tr.appendChild(el("td", {colSpan: columns.length, className: "muted"}, "none"));
    t.appendChild(tr);
  }
}

function searchable(inputId, tableId) {
  document.getElementById(inputId).addEventListener("input", ev => {
    document.querySelectorAll("#" + tableId + " tr").forEach((tr, i) => {
      if (i) tr.style.display = rowMatches(tr.textContent, ev.target.value) ? "" : "none";
    });
  });
}

// Cards [title, value, note] into the element `id` (emptied first).
function showCards(id, cards) {
  const box = document.getElementById(id);
  box.textContent = "";
  cards.forEach(c => {
    const card = el("div", {className: "card"});
    card.appendChild(el("div", {className: "k"}, c[0]));
    card.appendChild(el("div", {className: "v"}, c[1]));
    card.appendChild(el("div", {className: "muted"}, c[2]));
    box.appendChild(card);
  });
}

function setText(id, text) {
  document.getElementById(id).textContent = text;
}
