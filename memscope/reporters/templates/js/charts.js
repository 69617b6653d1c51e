// Chart building blocks shared by the pages: units, colours, layouts, peak markers. The
// builders return plain Plotly objects; plot() is the one place that draws.

const MIB = 1048576;
const PLOT_CONFIG = {displaylogo: false, responsive: true};
// One colour per category on every chart; the bands of a category vary in lightness.
const CATEGORIES = ["parameters", "main_params", "buffers", "gradients", "optimizer_state", "other", "activations"];
const PEAK_RED = "#b4261b";

function mib(values) {
  return values.map(v => (finite(v) ? v / MIB : null));
}

function hover(values) {
  return values.map(v => plotlyText(fmtBytes(v)));
}

function hue(i) {
  return Math.round((i * 137.508) % 360);
}

function color(i) {
  return "hsl(" + hue(i) + ",62%,45%)";
}

function categoryColor(category, k) {
  const i = CATEGORIES.indexOf(category);
  const lightness = 38 + ((k || 0) % 5) * 7;
  return "hsl(" + hue(i < 0 ? CATEGORIES.length : i) + ",62%," + lightness + "%)";
}

// A y axis in MiB; a step axis (integer ticks, every step when there are few) when `steps`.
function layout(xTitle, steps) {
  const x = {title: {text: xTitle}};
  if (steps) {
    x.tickformat = "d";
    if (steps.length <= 20) x.dtick = 1;
  }
  const y = {title: {text: "MiB"}, rangemode: "tozero"};
  return {margin: {t: 20, r: 20, b: 48, l: 80}, xaxis: x, yaxis: y, hovermode: "closest", height: 360};
}

// A dotted vertical line at x with a labelled arrow at (x, bytes).
function peakMarker(x, bytes, label) {
  const at = plotlyValues([x])[0];
  const line = {color: PEAK_RED, width: 1, dash: "dot"};
  return {
    shapes: [{type: "line", x0: at, x1: at, yref: "paper", y0: 0, y1: 1, line: line}],
    annotations: [{x: at, y: mib([bytes])[0], text: plotlyText(label), showarrow: true, arrowhead: 0, ax: 0, ay: -24}],
  };
}

// Bars side by side: one trace per series {name, values} over the same x names.
function groupedBars(names, series) {
  return series.map((s, i) => ({
    type: "bar", name: plotlyText(s.name), x: plotlyValues(names), y: mib(s.values),
    text: hover(s.values), marker: {color: color(s.color === undefined ? i + 1 : s.color)},
  }));
}

function plot(id, traces, lay) {
  Plotly.newPlot(id, traces, lay, PLOT_CONFIG);
}
