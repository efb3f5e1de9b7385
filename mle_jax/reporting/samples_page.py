"""samples.html: a static page, beside report.md, to browse a run's samples (samples.jsonl) opened from disk.

One file, no server and nothing fetched (its script, style and data are inline): filters by step, task, status,
outcome, medal, prompt kind (and turn, where the records have one), a table of the samples that pass them, and one
sample read whole: its figures, plan, program (the instrumenter's print lines marked), stdout (the lines those prints
wrote marked), stderr, error and grader's reason. A field the page does not know is shown too (a figure in the
table of figures, a text as a block of its own).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PAGE = "samples.html"
FILTERS: tuple[str, ...] = ("step", "task", "status", "outcome", "medal", "prompt", "turn")

_STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 0; display: flex; height: 100vh; }
#left { width: 46%; overflow: auto; border-right: 1px solid #ccc; padding: 8px; box-sizing: border-box; }
#right { flex: 1; overflow: auto; padding: 8px 12px; box-sizing: border-box; }
h1 { font-size: 16px; margin: 0 0 6px; } h2 { font-size: 14px; margin: 14px 0 4px; }
#filters label { margin-right: 10px; white-space: nowrap; display: inline-block; margin-bottom: 4px; }
table { border-collapse: collapse; } td, th { padding: 2px 6px; border-bottom: 1px solid #eee; text-align: left; }
#samples td, #samples th { white-space: nowrap; }
#samples th { cursor: pointer; position: sticky; top: 0; background: #f4f4f4; }
#samples tr.sample { cursor: pointer; } #samples tr.sample:hover { background: #eef5ff; }
#samples tr.selected { background: #d6e8ff; }
.valid { color: #1a7f37; } .invalid { color: #b42318; }
pre { background: #f7f7f7; border: 1px solid #e3e3e3; padding: 6px; overflow: auto; margin: 0; }
pre.wrap { white-space: pre-wrap; overflow-wrap: anywhere; }
pre.lines { counter-reset: line; } pre.lines span.line { display: block; counter-increment: line; }
pre.lines span.line::before { content: counter(line); display: inline-block; width: 3.5em; color: #999; }
span.line.instr { background: #fff3bf; } span.line.instr::after { content: "  \\25c0 instrumenter"; color: #b08800; }
span.line.progress { background: #fff3bf; }
.legend { color: #666; font-size: 12px; }
"""

_SCRIPT = r"""
const samples = JSON.parse(document.getElementById("data").textContent);
const FILTERS = JSON.parse(document.getElementById("filters-keys").textContent);
const TASKS = new Set(samples.map(r => r.task));
const COLUMNS = ["step", "uid", "task", "prompt", "turn", "status", "outcome", "reward", "score", "medal",
                 "duration_s", "lag"].filter(k => samples.some(r => k in r) && (k !== "task" || TASKS.size > 1));
const SHOWN = new Set(["plan", "program", "instrumenter_lines", "stdout", "progress_lines", "stderr", "code"]);
const MAX_ROWS = 2000;
let sortKey = null, sortDown = false, selected = null;

const show = v => v === null || v === undefined ? "—" : typeof v === "number" ? String(+v.toFixed(4)) : String(v);
const el = (tag, attrs = {}, text) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
};

function buildFilters() {
  const box = document.getElementById("filters");
  for (const key of FILTERS) {
    if (!samples.some(r => key in r)) continue;
    const values = [...new Set(samples.map(r => show(r[key])))];
    values.sort((a, b) => (isNaN(a) || isNaN(b)) ? a.localeCompare(b) : a - b);
    const select = el("select", {id: "filter-" + key, "data-key": key});
    select.appendChild(el("option", {value: ""}, "all"));
    for (const v of values) select.appendChild(el("option", {value: v}, v));
    select.addEventListener("change", render);
    const label = el("label", {}, key + " ");
    label.appendChild(select);
    box.appendChild(label);
  }
}

function passing() {
  const chosen = [...document.querySelectorAll("#filters select")].filter(s => s.value !== "");
  let rows = samples.filter(r => chosen.every(s => show(r[s.dataset.key]) === s.value));
  if (sortKey) {
    const num = v => (v === null || v === undefined) ? -Infinity : v;
    rows = [...rows].sort((a, b) => {
      const x = num(a[sortKey]), y = num(b[sortKey]);
      const c = typeof x === "string" || typeof y === "string" ? String(x).localeCompare(String(y)) : x - y;
      return sortDown ? -c : c;
    });
  }
  return rows;
}

function render() {
  const rows = passing();
  const table = document.getElementById("samples");
  table.replaceChildren();
  const head = el("tr");
  for (const k of COLUMNS) {
    const arrow = k === sortKey ? (sortDown ? " ▼" : " ▲") : "";
    const th = el("th", {"data-key": k}, (k === "duration_s" ? "Δt (s)" : k) + arrow);
    th.addEventListener("click", () => { sortDown = sortKey === k ? !sortDown : false; sortKey = k; render(); });
    head.appendChild(th);
  }
  table.appendChild(head);
  for (const r of rows.slice(0, MAX_ROWS)) {
    const tr = el("tr", {class: "sample" + (r === selected ? " selected" : ""), "data-uid": show(r.uid)});
    for (const k of COLUMNS) {
      const td = el("td", {"data-key": k}, show(r[k]));
      if (k === "outcome") td.className = r.valid ? "valid" : "invalid";
      tr.appendChild(td);
    }
    tr.addEventListener("click", () => { selected = r; render(); detail(r); });
    table.appendChild(tr);
  }
  document.getElementById("count").textContent = rows.length > MAX_ROWS
    ? `${rows.length} of ${samples.length} samples pass the filters; the first ${MAX_ROWS} are listed`
    : `${rows.length} of ${samples.length} samples pass the filters`;
}

function lines(text, marked, cls) {
  const pre = el("pre", {class: "lines"});
  const mark = new Set(marked || []);
  text.split("\n").forEach((line, i) => {
    pre.appendChild(el("span", {class: "line" + (mark.has(i + 1) ? " " + cls : "")}, line));
  });
  return pre;
}

function section(box, title, body, id) {
  box.appendChild(el("h2", {}, title));
  if (typeof body === "string") body = el("pre", {class: "wrap"}, body);  // prose: wrapped; programs keep lines
  if (id) body.id = id;
  box.appendChild(body);
}

function detail(r) {
  const box = document.getElementById("detail");
  box.replaceChildren();
  box.appendChild(el("h1", {}, `Sample ${show(r.uid)} (step ${show(r.step)}, ${r.task || "?"})`));
  const figures = el("table", {id: "figures"});
  const texts = [];
  for (const [k, v] of Object.entries(r)) {
    if (SHOWN.has(k)) continue;
    const long = typeof v === "string" && (v.includes("\n") || v.length > 160);
    const isObject = v !== null && typeof v === "object";
    if (long || isObject) { texts.push([k, isObject ? JSON.stringify(v, null, 2) : v]); continue; }
    const tr = el("tr");
    tr.appendChild(el("th", {}, k));
    tr.appendChild(el("td", {"data-key": k}, show(v)));
    figures.appendChild(tr);
  }
  box.appendChild(figures);
  if (r.texts_dropped) box.appendChild(el("p", {class: "legend"},
    "This sample's texts were not kept: samples.jsonl had reached its size cap (report.samples_mb)."));
  if (r.plan) section(box, "Plan", r.plan, "plan");
  if (typeof r.program === "string") {
    section(box, "Program (as run)", lines(r.program, r.instrumenter_lines, "instr"), "program");
    box.appendChild(el("p", {class: "legend"}, "Marked lines: the instrumenter's progress prints."));
  } else if (typeof r.code === "string") {
    section(box, "Program (the response's code; the program as run was not kept)", lines(r.code, [], ""), "program");
  } else {
    section(box, "Program", "(the response had no code block: nothing ran)", "program");
  }
  if (typeof r.program === "string" && typeof r.code === "string" && r.code !== r.program) {
    const d = el("details");
    d.appendChild(el("summary", {}, "The response's code, before instrumenting"));
    d.appendChild(lines(r.code, [], ""));
    box.appendChild(d);
  }
  if (r.stdout) {
    section(box, "stdout (its end)", lines(r.stdout, r.progress_lines, "progress"), "stdout");
  }
  if (r.stderr) section(box, "stderr (its end)", r.stderr, "stderr");
  for (const [k, v] of texts) section(box, k, v, "field-" + k);
}

buildFilters();
render();
"""


def _script_json(value: Any) -> str:
    """JSON to sit inside a <script> element: no "</script>" or "<!--" can end or bend it."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def samples_page(samples: Sequence[Mapping[str, Any]], title: str) -> str:
    """The page's HTML for `samples` (samples.jsonl's records, in order)."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{_STYLE}</style></head>
<body>
<div id="left"><h1>{html.escape(title)}</h1><div id="filters"></div><p id="count" class="legend"></p>
<table id="samples"></table></div>
<div id="right"><div id="detail"><p class="legend">Click a sample to read it.</p></div></div>
<script type="application/json" id="data">{_script_json(list(samples))}</script>
<script type="application/json" id="filters-keys">{_script_json(list(FILTERS))}</script>
<script>{_SCRIPT}</script>
</body></html>
"""


def write_samples_page(samples: Sequence[Mapping[str, Any]], workdir: str | Path, title: str) -> Path:
    """workdir/samples.html of `samples`; returns its path."""
    path = Path(workdir) / PAGE
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(samples_page(samples, title))
    tmp.replace(path)
    return path
