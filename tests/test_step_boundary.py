"""A step's end and a reading outside every module each have one name.

``events.schema.is_step_end`` is the one test of "this event is the step boundary's reading"
the analyzers use, and ``events.schema.NO_MODULE_LABEL`` the one label reports, pages and
messages give a place with no module (the pages' copy in ``format.js`` must agree).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from memscope.events import schema as s
from memscope.reporters.oom_report import render_oom_markdown

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "memscope" / "reporters" / "templates" / "js"
#: The spellings the label replaced, none of which may come back as a string of its own.
OLD_SPELLINGS = ("no module", "(none)", "step boundary")


def _event(event_type: str, phase: str) -> s.MemoryEvent:
    return s.MemoryEvent(
        seq=1, event_type=event_type, module="", module_class="", phase=phase, step=3,
        microbatch=None, pipeline_stage=0, virtual_chunk=None, recompute=False, timestamp=0.0,
        rank=0, mem_allocated_before=0, mem_allocated_after=0, mem_reserved_before=0,
        mem_reserved_after=0, max_mem_allocated=0, max_mem_reserved=0,
    )  # fmt: skip


def test_only_the_whole_step_reading_is_the_step_end():
    assert s.is_step_end(_event(s.STEP_PHASE, s.PHASE_STEP))
    assert not s.is_step_end(_event(s.STEP_PHASE, s.PHASE_OPTIMIZER))
    assert not s.is_step_end(_event(s.MODULE_FORWARD, s.PHASE_STEP))


def test_the_pages_label_a_place_with_no_module_as_the_reports_do():
    found = re.findall(r'^const NO_MODULE = "([^"]*)";$', (JS / "format.js").read_text(), re.M)
    assert found == [s.NO_MODULE_LABEL]
    assert s.module_label("") == s.module_label(None) == s.NO_MODULE_LABEL
    assert s.module_label("decoder.layers.0") == "decoder.layers.0"


def test_the_oom_report_names_a_failure_outside_every_module_by_the_label():
    doc = {"rank": 0, "world_size": 1, "where": {"step": 2, "phase": "optimizer", "module": ""}}
    assert f"module `{s.NO_MODULE_LABEL}`" in render_oom_markdown(doc)


def test_no_module_or_page_script_spells_the_label_again():
    offenders = []
    for path in sorted((ROOT / "memscope").rglob("*.py")):
        if path.name == "schema.py" and path.parent.name == "events":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value.strip("'\" ")
                if text in (s.NO_MODULE_LABEL, *OLD_SPELLINGS):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    for path in sorted(JS.glob("*.js")):
        for spelling in (s.NO_MODULE_LABEL, *OLD_SPELLINGS):
            if path.name != "format.js" and f'"{spelling}"' in path.read_text():
                offenders.append(f"{path.relative_to(ROOT)}: {spelling}")
    assert offenders == []
