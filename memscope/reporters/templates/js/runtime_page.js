// The rank page's wiring: draws the report's sections in the order of its index
// (runtime_sections.js), then the errors and the metadata.

function showRuntimePage(P) {
  drawSections(P, RANK_SECTIONS);
  table("errors", [["kind", "kind"], ["site", "site"], ["count", "count"], ["first_error", "detail"]], errorRows(P));
  table("meta", [["key", "key"], ["value", "value"]], metadataRows(P));
}

showRuntimePage(DATA);
