// The diff page's content computed from one rank pair of the diff document
// (memscope/analysis/diff.py). Pure functions.

function diffCards(d) {
  const p = d.peak, moved = Object.keys(p.moved).length ? "the peak moved" : "same moment";
  return [["Peak A", fmtBytes(p.a_bytes), momentText(p.a_moment)], ["Peak B", fmtBytes(p.b_bytes), momentText(p.b_moment)],
    ["B − A", fmtBytes(p.delta_bytes, true), moved]];
}

function categoryBars(pair) {
  const byCategory = pair.diff.composition.by_category, cats = Object.keys(byCategory);
  return groupedBars(cats, [{name: "A: " + pair.a, values: cats.map(c => byCategory[c].a)},
    {name: "B: " + pair.b, values: cats.map(c => byCategory[c].b)}]);
}

// A row's microbatches: "0,1" when A and B agree, else "A's → B's" ("—" for none).
function microbatchesText(r) {
  if (!r.microbatches_a) return r.microbatch;
  const a = r.microbatches_a.join(","), b = r.microbatches_b.join(",");
  return a === b ? a : (a || "—") + " → " + (b || "—");
}

const DIFF_COLUMNS = [["status", "status"], ["category", "category"], ["module", "module"], ["mb", "microbatch"],
  ["a_bytes", "A", "bytes"], ["b_bytes", "B", "bytes"], ["delta_bytes", "B − A", "delta"]];

function diffRows(composition) {
  return composition.rows.map(r => Object.assign({mb: microbatchesText(r)}, r));
}

function diffNote(d) {
  const notes = [], c = d.composition;
  if (d.layout && !d.layout.same) {
    notes.push(`Different parallel layouts: A is ${d.layout.a}, B is ${d.layout.b}; the ranks hold different shards.`);
  }
  if (!c.available) notes.push("No comparison of what was live: " + c.reason + ".");
  else if (c.over_microbatches) {
    const moved = c.moved_between_microbatches ? `; ${c.moved_between_microbatches} more only moved between microbatches.` : ".";
    notes.push("The live microbatches differ between A and B: items are summed over microbatches (A's → B's)" + moved);
  }
  return notes.join(" ");
}

const STEP_GROUPS = ["totals", "phase_peaks", "categories_end"];

function stepColumns(s) {
  const what = s ? `step ${s.a_step} (A) vs step ${s.b_step} (B)` : "no step given";
  return [["what", what], ["a", "A", "bytes"], ["b", "B", "bytes"], ["delta", "B − A", "delta"]];
}

function stepRows(s) {
  if (!s) return [];
  return STEP_GROUPS.flatMap(group => Object.entries(s[group]).map(([k, v]) => (
    {what: spaced(group) + ": " + k, a: v.a, b: v.b, delta: v.delta})));
}
