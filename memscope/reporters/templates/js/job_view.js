// The job page's content computed from its payload (html_payload.job_payload): cards, the
// rank grid, the per-rank timelines and table rows. Pure functions of the payload.

function oomWhere(w) {
  return w ? `step ${w.step}, ${w.phase}, ${w.module || NO_MODULE}` : "?";
}

// [title, value, note] for each card at the top of the page; out of memory first.
function jobCards(J) {
  const imb = J.imbalance || {}, O = J.oom || {};
  const cards = [["Ranks", String(J.world_size), `${J.missing} missing, ${J.incomplete} incomplete`]];
  if (imb.max_bytes !== undefined) {
    const where = ` (pp ${imb.max_pp_rank ?? "?"}, tp ${imb.max_tp_rank ?? "?"})`;
    cards.push(["Heaviest rank", "rank " + imb.max_rank, fmtBytes(imb.max_bytes) + where]);
    cards.push(["Imbalance max / min", imb.ratio.toFixed(3) + "×", `rank ${imb.min_rank}: ${fmtBytes(imb.min_bytes)}`]);
  }
  if (O.ranks && O.ranks.length) {
    const named = O.ranks.slice(0, 8).map(o => `rank ${o.rank} (${o.verdict || "?"}): ${oomWhere(o.where)}`);
    cards.unshift(["Out of memory", O.ranks.length + " rank(s)", named.join("; ")]);
  }
  if (O.tightest_headroom !== null && O.tightest_headroom !== undefined) {
    const note = `rank ${O.tightest_rank}, of ${O.ranks_with_headroom} rank(s) with a known device size`;
    cards.push(["Tightest headroom", fmtBytes(O.tightest_headroom), note]);
  }
  return cards;
}

// "activations 3.00 MiB, parameters 1.00 MiB": the terms that hold bytes, largest first.
function termsText(terms) {
  const held = Object.entries(terms || {}).filter(e => e[1]).sort((a, b) => b[1] - a[1]);
  return held.map(e => `${e[0]} ${fmtBytes(e[1])}`).join(", ");
}

const STAGE_COLUMNS = [["pp_rank", "stage"], ["ranks", "ranks"], ["peak_max", "highest peak", "bytes"],
  ["peak_median", "median", "bytes"], ["peak_min", "lowest", "bytes"], ["max_rank", "heaviest rank"],
  ["terms", "its terms at the peak"], ["acts", "activations: measured / predicted"], ["flight", "in flight: measured / predicted"],
  ["least_headroom_rank", "least headroom: rank"], ["least_headroom", "headroom", "bytes"], ["binding_term", "binding term"]];

function stageRows(stages) {
  return (stages || []).map(x => {
    const measured = (x.max_terms || {}).activations, predicted = (x.max_predicted_terms || {}).activations;
    return Object.assign({}, x, {
      terms: termsText(x.max_terms), acts: `${fmtBytes(measured)} / ${fmtBytes(predicted)}`,
      flight: `${x.in_flight_measured ?? "?"} / ${x.in_flight_predicted ?? "?"}`,
    });
  });
}

const OUTLIER_COLUMNS = [["rank", "rank"], ["pp_rank", "stage"], ["peak_allocated", "peak", "bytes"],
  ["stage_median", "stage median", "bytes"], ["deviation", "off the median", "ratio"], ["term", "term that differs most"],
  ["term_delta", "by", "delta"]];

const RANK_COLUMNS = [["rank", "rank", "link"], ["status", "status"], ["tp_rank", "tp"], ["pp_rank", "pp"], ["dp_rank", "dp"],
  ["peak_allocated", "peak allocated", "bytes"], ["peak_reserved", "peak reserved", "bytes"], ["peak_step", "step"],
  ["peak_phase", "phase"], ["peak_module", "module"], ["static_peak", "static estimate", "bytes"],
  ["static_diff", "static − runtime", "delta", "peak_allocated"], ["static_ratio", "(static − runtime) / runtime peak", "ratio"],
  ["headroom", "headroom", "bytes"], ["problem", "problem"]];

// A rank links to its page; a run of missing ranks is one row "first–last"; a report of
// another run says so in its status.
function rankRow(r) {
  const rank = r.last_rank !== undefined ? r.rank + "–" + r.last_rank : r.page ? {label: r.rank, href: r.page} : r.rank;
  const row = Object.assign({}, r, {rank: rank});
  return r.other_run ? Object.assign(row, {status: row.status + " (other run: " + r.run_id + ")"}) : row;
}

// The heatmap of each rank's peak: stages down, the other coordinates across.
function gridHeatmap(G) {
  const z = G.stages.map(() => G.columns.map(() => null)), txt = G.stages.map(() => G.columns.map(() => ""));
  G.cells.forEach(([s, c, rank, peak]) => {
    z[s][c] = peak / MIB;
    txt[s][c] = `rank ${rank}: ${fmtBytes(peak)}`;
  });
  return {
    type: "heatmap", z: z, x: plotlyValues(G.columns), y: plotlyValues(G.stages.map(s => "stage " + s)),
    text: plotlyMatrix(txt), hovertemplate: "%{y}, %{x}<br>%{text}<extra></extra>", colorbar: {title: "MiB"},
  };
}

function gridLayout(G) {
  return {
    margin: {t: 10, l: 80, r: 10, b: 80}, height: Math.min(600, 120 + 40 * G.stages.length),
    xaxis: {type: "category"}, yaxis: {type: "category", autorange: "reversed"},
  };
}

// One line per rank of the series `key` (peak_allocated, allocated_end or reserved_end).
function rankTimelines(timelines, key) {
  return Object.entries(timelines).map(([rank, S], i) => ({
    x: plotlyValues(S.step), y: mib(S[key]), text: hover(S[key]), hovertemplate: "step %{x}: %{text}<extra>%{fullData.name}</extra>",
    name: plotlyText("rank " + rank), mode: "lines+markers", line: {color: color(i)},
  }));
}

function timelinesNote(J) {
  const plotted = Object.keys(J.timelines).length;
  if (J.timelines_total <= plotted) return "";
  return `${plotted} of ${J.timelines_total} ranks plotted: those that failed, the highest peak of each pipeline stage,` +
    " then the highest peaks.";
}
