"""The names of MemScope's files are written once, in ``memscope/events/file_names.py``.

Every other module of the package and every tool imports them: a module that spells
``"runtime_report.json"`` (or builds ``f"rank{rank:05d}"``) again is the defect this finds.
Docstrings and help texts may name the files in prose; tests keep literals where they assert
the on-disk contract (here: the defined values themselves).
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

from memscope.events import file_names

ROOT = Path(__file__).resolve().parent.parent
DEFINING = ROOT / "memscope" / "events" / "file_names.py"
#: The file names (a folder's, like ``profiler``, is also an ordinary word: not searched for).
NAMES = {
    value
    for name, value in vars(file_names).items()
    if name.isupper() and isinstance(value, str) and "." in value
} | {*file_names.LOG_REPORT_NAMES, *file_names.DIFF_REPORT_NAMES}


def _spellings(path: Path) -> list[str]:
    """``line: what`` for each string constant of ``path`` that is one of the file names, and
    each f-string that builds a rank folder's name by hand."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and node.value in NAMES:
            found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            for head, value in itertools.pairwise(parts):
                spec = value.format_spec if isinstance(value, ast.FormattedValue) else None
                if (
                    isinstance(head, ast.Constant)
                    and str(head.value).endswith("rank")
                    and isinstance(spec, ast.JoinedStr)
                    and ast.unparse(spec).strip("f'\"") == "05d"
                ):
                    found.append(f"{node.lineno}: a rank folder name built by hand")
    return sorted(found)


def test_the_file_names_module_defines_the_on_disk_contract():
    assert file_names.REPORT_NAME == "runtime_report.json"
    assert file_names.TRACE_NAME == "trace.jsonl"
    assert file_names.JOB_SUMMARY_NAME == "job_summary.json"
    assert file_names.rank_folder_name(7) == "rank00007"
    assert file_names.RANK_DIR.match(file_names.rank_folder_name(123456))
    assert file_names.LOG_REPORT_NAMES == ("log_report.json", "log_report.md", "log_report.html")


def test_the_checker_finds_a_spelled_file_name_and_a_hand_built_rank_folder(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('import os\nP = os.path.join("d", "trace.jsonl")\nQ = f"rank{3:05d}"\n')
    assert _spellings(bad) == ["2: 'trace.jsonl'", "3: a rank folder name built by hand"]


def test_no_module_of_the_package_or_the_tools_spells_a_file_name():
    files = sorted((ROOT / "memscope").rglob("*.py")) + sorted((ROOT / "tools").glob("*.py"))
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in files
        if path != DEFINING and (found := _spellings(path))
    }
    assert offenders == {}, "import these names from memscope/events/file_names.py"
