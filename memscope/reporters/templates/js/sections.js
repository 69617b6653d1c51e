// Drawing a page's sections index: each page's payload lists its sections in order
// ({name, renderer, ...}; the rank page's from the report's index, the job page's from
// JOB_PAGE_SECTIONS in memscope/reporters/html_payload.py), and a registry maps a renderer name
// to the function that fills its partial (RANK_SECTIONS, JOB_SECTIONS).

// The entries of the index that `registry` has a renderer of, in the index's order (a section
// without one is drawn by its markup alone).
function sectionsToDraw(sections, registry) {
  return (sections || []).filter(s => typeof s.renderer === "string" && Object.hasOwn(registry, s.renderer));
}

function drawSections(P, registry) {
  sectionsToDraw(P.sections, registry).forEach(section => registry[section.renderer](P, section));
}
