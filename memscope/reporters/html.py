"""Self-contained HTML pages from plain payloads: jinja2 (autoescape on), plotly.js inlined.

The payload is embedded once, as JSON inside ``<script type="application/json">`` with
``<``, ``>``, ``&`` and the JavaScript line separators escaped, so no value can close the
script element or inject markup; the page's script parses it with ``JSON.parse``.

Strings from the data reach the page in three ways, each with one rule:

- server-side ``{{ ... }}`` in the templates: autoescaped by jinja2, and (``finalize``) made
  printable: control characters and lone surrogates become visible escapes;
- DOM tables and cards built by the page's script: ``textContent`` only, never ``innerHTML``;
- Plotly (trace names, hover text, tick labels, annotations): every data string goes through
  the page's ``plotlyText()``, which escapes ``&``, ``<`` and ``>`` so Plotly's pseudo-HTML
  (``<a href>``, ``<span style>``, ``<br>``) shows as text.

The pages' script lives in ``templates/js/`` (formatting, tables, charts, then one view and one
wiring file per page); :func:`page_js` inlines the files a template names, in that order, into
one ``<script>`` element, so a page stays one file. ``tests/js/`` unit-tests the files under node.
The rank page's sections are drawn in the order of the report's index: each by its partial in
``templates/sections/`` and its function in ``RANK_SECTIONS`` (``js/runtime_sections.js``),
or by the generic partial (see :func:`memscope.reporters.html_payload.page_sections`).
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import os
import re
from typing import Any

import jinja2
from markupsafe import Markup

from memscope.reporters.html_payload import MAX_ROWS, page_sections
from memscope.units import NUMBER_RULES, printable

_SCRIPT_ESCAPES = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def script_safe_json(data: Any) -> str:
    """JSON text that is safe to place verbatim inside a ``<script>`` element."""
    return json.dumps(data, separators=(",", ":"), allow_nan=False).translate(_SCRIPT_ESCAPES)


@functools.lru_cache(maxsize=1)
def plotly_js() -> str:
    """The plotly.js bundle shipped with the installed ``plotly`` package."""
    import plotly

    path = os.path.join(os.path.dirname(plotly.__file__), "package_data", "plotly.min.js")
    with open(path, encoding="utf-8") as f:
        return f.read()


#: What must never appear in an inlined script: it would end the script element early.
_SCRIPT_BREAKERS = re.compile(r"</script|<!--", re.I)


@functools.cache
def _js_file(name: str) -> str:
    text = (importlib.resources.files("memscope.reporters") / "templates" / "js" / name).read_text(
        encoding="utf-8"
    )
    assert not _SCRIPT_BREAKERS.search(text), f"{name} would end its <script> element"
    return text


def page_js(*names: str) -> Markup:
    """The page scripts ``names`` (files in ``templates/js/``), joined to be inlined as they are."""
    return Markup("\n".join(_js_file(name) for name in names))


def _finalize(value: Any) -> Any:
    """Every ``{{ }}`` value: data strings printable (the inlined JSON and plotly.js are
    :class:`Markup` made here and pass as they are)."""
    if isinstance(value, Markup):
        return value
    return printable(value) if isinstance(value, str) else value


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("memscope", "reporters/templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
    )
    env.globals["page_js"] = page_js
    return env


def _render(template: str, payload: dict[str, Any], title: str) -> str:
    return (
        _environment()
        .get_template(template)
        .render(
            title=title,
            payload=payload,
            data_json=Markup(script_safe_json(payload)),
            number_rules=Markup(script_safe_json(NUMBER_RULES)),
            plotly_js=Markup(plotly_js()),
        )
    )


def render_runtime_html(payload: dict[str, Any]) -> str:
    """One rank's page from :func:`memscope.reporters.html_payload.runtime_payload`."""
    if "sections" not in payload:  # a payload made by hand: the built-in sections, in order
        payload = {**payload, "sections": page_sections({}, MAX_ROWS)}
    title = f"MemScope — rank {payload.get('rank')} of {payload.get('world_size')}"
    if payload.get("grid"):
        title += f" ({payload['grid']})"
    return _render("runtime.html.j2", payload, title)


def render_job_html(payload: dict[str, Any]) -> str:
    """A job's page from :func:`memscope.reporters.html_payload.job_payload`."""
    return _render("job.html.j2", payload, f"MemScope — job of {payload.get('world_size')} ranks")


def render_diff_html(payload: dict[str, Any]) -> str:
    """The ``memscope diff`` page from its document (see :mod:`memscope.analysis.diff`)."""
    return _render("diff.html.j2", payload, "MemScope — diff")


def render_log_html(doc: dict[str, Any]) -> str:
    """The ``memscope analyze-log`` page from ``log_report.json``: per run, the sections of
    its index in order, each by its layout or (a chart) by its renderer."""
    from memscope.reporters.log_report import log_payload

    return _render("log.html.j2", log_payload(doc), "MemScope — training log explained")
