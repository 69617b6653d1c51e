#!/usr/bin/env node
// Run PyTorch's MemoryViz.js data path (unpickle -> annotate_snapshot ->
// process_alloc_data) under Node and print the "Active Memory Timeline" peak.
//
// usage: node tools/memory_viz_check/run_viewer.mjs <path/to/MemoryViz.js> <snapshot.pickle>
//            [--device N] [--max-entries N] [--segments] [--render] [--json] [--verbose]
//
// * MemoryViz.js is read from the given path (nothing vendored).  Its CDN d3
//   imports are rewritten to the npm "d3" package (node_modules next to this
//   script) and relative imports (newer versions: "./process_alloc_data.js")
//   are rewritten to absolute file URLs next to the given MemoryViz.js.
// * The module's internal functions are reached by appending an aliased
//   export line to the rewritten copy (written under .tmp/ here, so that its
//   "d3" import resolves to this folder's node_modules).
// * Needs `npm install` in this folder first (d3, jsdom: package.json).
// * The module's top-level UI code needs a DOM; jsdom supplies one.
// * --render additionally drives the real UI path (add_local_files with the
//   base64 pickle, like torch.cuda._memory_viz.trace_plot's HTML does) and
//   reports the polygons / y-axis drawn into the jsdom document.

import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import {fileURLToPath, pathToFileURL} from 'node:url';
import {JSDOM} from 'jsdom';

const HERE = path.dirname(fileURLToPath(import.meta.url));

function usage(msg) {
  if (msg) console.error(msg);
  console.error(
    'usage: node run_viewer.mjs <MemoryViz.js> <snapshot.pickle> ' +
      '[--device N] [--max-entries N] [--segments] [--render] [--json] [--verbose]',
  );
  process.exit(2);
}

const argv = process.argv.slice(2);
const pos = [];
const opt = {device: null, maxEntries: 15000, segments: false, render: false, json: false, verbose: false};
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  if (a === '--device') opt.device = Number(argv[++i]);
  else if (a === '--max-entries') opt.maxEntries = Number(argv[++i]);
  else if (a === '--segments') opt.segments = true;
  else if (a === '--render') opt.render = true;
  else if (a === '--json') opt.json = true;
  else if (a === '--verbose') opt.verbose = true;
  else if (a.startsWith('--')) usage(`unknown option ${a}`);
  else pos.push(a);
}
if (pos.length !== 2) usage();
const [vizPath, picklePath] = pos.map(p => path.resolve(p));

// ---- DOM globals for the module's top-level UI code -----------------------
const dom = new JSDOM('<!DOCTYPE html><html><head></head><body></body></html>', {
  pretendToBeVisual: true,
});
globalThis.window = dom.window;
globalThis.document = dom.window.document;
for (const k of ['Element', 'HTMLElement', 'SVGElement', 'Node', 'Event', 'MouseEvent']) {
  if (!(k in globalThis)) globalThis[k] = dom.window[k];
}
if (typeof globalThis.navigator === 'undefined') {
  Object.defineProperty(globalThis, 'navigator', {value: dom.window.navigator, configurable: true});
}
if (!globalThis.requestAnimationFrame) {
  globalThis.requestAnimationFrame = cb => setTimeout(cb, 0);
}

// The module console.log()s the whole snapshot and JSON-fallback notices;
// keep stdout clean unless --verbose.
const realLog = console.log;
const quiet = () => { console.log = opt.verbose ? (...a) => console.error(...a) : () => {}; };
const loud = () => { console.log = realLog; };

// ---- rewrite + load MemoryViz.js ------------------------------------------
const tmpDir = path.join(HERE, '.tmp');
fs.mkdirSync(tmpDir, {recursive: true});
const rewrites = [];

// Copy a module's text to tmp/<name>.<hash>.mjs (".mjs" so Node treats it as
// ESM regardless of any package.json "type"), after rewriting its imports:
//  - CDN d3 imports (skypack d3@5 / d3-axis@1 ..., jsdelivr d3@7/+esm ...) -> npm
//    "d3" (v7 re-exports axisLeft, scaleLinear, zoom, zoomIdentity, brushX);
//  - relative imports (newer MemoryViz.js: "./process_alloc_data.js") -> the
//    sibling file next to the given MemoryViz.js, itself copied the same way.
function rewriteModule(text, dir, extra = '') {
  text = text.replace(
    /^(\s*import\b[^;'"]*?\bfrom\s*)(["'])(https?:\/\/[^"']*?\/(d3(?:-[a-z]+)?)@[^"']*)\2/gm,
    (m, pre, q, url) => { rewrites.push(`${url} -> d3 (npm)`); return `${pre}"d3"`; },
  );
  text = text.replace(
    /^(\s*import\b[^;'"]*?\bfrom\s*)(["'])(\.{1,2}\/[^"']+)\2/gm,
    (m, pre, q, rel) => {
      const abs = path.resolve(dir, rel);
      if (!fs.existsSync(abs)) {
        console.error(`error: module imports ${rel}; expected it at ${abs}`);
        process.exit(2);
      }
      const dep = rewriteModule(fs.readFileSync(abs, 'utf8'), path.dirname(abs));
      rewrites.push(`${rel} -> ${abs} (as ${dep})`);
      return `${pre}"${pathToFileURL(dep).href}"`;
    },
  );
  const remaining = text.match(/^\s*import\b[^;'"]*?\bfrom\s*["']https?:[^"']*["']/gm);
  if (remaining) usage(`unhandled remote imports: ${remaining.join(', ')}`);
  text += extra;
  const h = crypto.createHash('sha1').update(text).digest('hex').slice(0, 12);
  const f = path.join(tmpDir, `mod.${h}.mjs`);
  fs.writeFileSync(f, text);
  return f;
}

let src = fs.readFileSync(vizPath, 'utf8');
const vizDir = path.dirname(vizPath);
const wanted = ['unpickle', 'annotate_snapshot', 'process_alloc_data', 'decode_base64'];
for (const name of wanted) {
  const defined = new RegExp(`function\\s+${name}\\s*\\(`).test(src);
  const imported = new RegExp(`import\\s*\\{[^}]*\\b${name}\\b[^}]*\\}`).test(src);
  if (!defined && !imported) usage(`MemoryViz.js has no function ${name}; unsupported version`);
}
// The functions we need are module-private: reach them by appending an
// aliased export line (works for both locally defined and imported bindings).
const exportLine = `\nexport { ${wanted.map(n => `${n} as __mv_${n}`).join(', ')} };\n`;
const tmpFile = rewriteModule(src, vizDir, exportLine);

quiet();
const mv = await import(pathToFileURL(tmpFile).href);
loud();

// ---- data path -------------------------------------------------------------
const bytes = fs.readFileSync(picklePath);
const ab = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);

quiet();
const snapshot = mv.__mv_unpickle(ab);
loud();
mv.__mv_annotate_snapshot(snapshot); // throws on some inputs, e.g. categories w/o 'unknown'

let device = opt.device;
if (device === null) {
  // same rule as snapshot_change(): first device with trace events or segments
  const has_segments = new Set(snapshot.segments.map(s => s.device));
  device = snapshot.device_traces.findIndex((t, i) => t.length > 0 || has_segments.has(i));
  if (device < 0) device = 0;
}

const data = mv.__mv_process_alloc_data(snapshot, device, opt.segments, opt.maxEntries);
const maxAtTime = data.max_at_time.reduce((a, b) => Math.max(a, b), 0);
const out = {
  memoryviz: vizPath,
  layout: /function\s+process_alloc_data\s*\(/.test(src) ? 'monolithic' : 'process_alloc_data.js',
  view: opt.segments ? 'Active Cached Segment Timeline' : 'Active Memory Timeline',
  device,
  trace_events_after_annotate: snapshot.device_traces[device]?.length ?? 0,
  categories: snapshot.categories,
  elements: data.elements_length,
  max_size: data.max_size,
  max_of_max_at_time: maxAtTime,
  timesteps: data.max_at_time.length,
};

if (opt.verbose) {
  out.rewrites = rewrites;
  out.hover = {};
  for (const d of data.allocations_over_time) {
    if (typeof d.elem === 'number') out.hover[d.elem] = data.context_for_id(d.elem);
  }
}

if (opt.render) {
  // Drive the real UI entry point (what trace_plot()'s HTML does).
  let b = Buffer.from(bytes);
  if (b.length % 3) b = Buffer.concat([b, Buffer.alloc(3 - (b.length % 3))]);
  quiet();
  mv.add_local_files(
    [{name: 'snapshot.pickle', base64: b.toString('base64')}],
    out.view,
  );
  await new Promise(r => setTimeout(r, 50));
  loud();
  const polys = document.querySelectorAll('svg polygon');
  const ticks = [...document.querySelectorAll('svg g.tick text')].map(t => t.textContent);
  out.render = {polygons: polys.length, y_axis_ticks: ticks};
}

if (opt.json) {
  realLog(JSON.stringify(out, null, 2));
} else {
  for (const [k, v] of Object.entries(out)) {
    if (k === 'hover' || k === 'render' || k === 'rewrites') continue;
    realLog(`${k}: ${Array.isArray(v) ? JSON.stringify(v) : v}`);
  }
  if (out.rewrites) realLog('rewrites:\n  ' + out.rewrites.join('\n  '));
  if (out.render) realLog(`render: ${JSON.stringify(out.render)}`);
  if (out.hover) {
    for (const [k, v] of Object.entries(out.hover)) realLog(`--- hover elem ${k}:\n${v}`);
  }
  realLog(`PEAK ${data.max_size}`);
}
process.exit(0);
