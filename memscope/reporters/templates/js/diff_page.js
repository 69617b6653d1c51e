// The diff page's wiring: one rank pair at a time, chosen in the rank selector.

function showDiffPage(D) {
  const sel = document.getElementById("rank");
  D.ranks.forEach((p, i) => sel.appendChild(el("option", {value: String(i)}, String(p.rank))));
  const draw = () => {
    const pair = D.ranks[Number(sel.value)], d = pair.diff;
    showCards("cards", diffCards(d));
    plot("categories", categoryBars(pair), Object.assign(layout("category"), {barmode: "group"}));
    table("rows", DIFF_COLUMNS, diffRows(d.composition));
    setText("note", diffNote(d));
    table("steps", stepColumns(d.steps), stepRows(d.steps));
  };
  sel.addEventListener("change", draw);
  searchable("search", "rows");
  draw();
}

showDiffPage(DATA);
