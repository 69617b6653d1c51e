"""No module-level name of the package that nothing uses.

A public (no leading ``_``) function, class or constant defined at the top of a module in
``memscope/`` must be referenced somewhere: in the package, its tests, ``tools/``, the page
templates and scripts, or ``pyproject.toml`` (entry points). The package's public API that only
users call is named in an ``__all__`` or in :data:`PUBLIC_API` below. One ``ast`` pass over
the package, words of the rest (well under 2 s).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "memscope"
#: Public API no code of this repository calls (documented for users), and the names a
#: helper's file in flight keeps: each with why.
PUBLIC_API = {
    # inputs/config_files.py: the JSON-config reader, a documented public reader (CHANGELOG)
    "spec_from_json_config",
}
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def defined_names(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, name)`` of the public functions, classes and constants a module defines at
    its top level, and the names its ``__all__`` exports (as ``(0, name)``)."""
    out: list[tuple[int, str]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.append((node.lineno, node.name))
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            if names == ["__all__"] and node.value is not None:
                out += [(0, v) for v in ast.literal_eval(node.value)]
            out += [(node.lineno, n) for n in names]
    return [(line, name) for line, name in out if not name.startswith("_")]


def read_names(tree: ast.Module) -> set[str]:
    """Every name a module reads: loads, attributes and imports."""
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.alias):
            used.add(node.name.rsplit(".", 1)[-1])
    return used


def unused(package: Path, text: Iterable[Path]) -> list[str]:
    """``file:line: name`` of each public module-level name of ``package`` that no module of
    it reads and no word of the ``text`` files names."""
    used = set(PUBLIC_API)
    for path in text:
        used.update(WORD.findall(path.read_text(encoding="utf-8")))
    defined: list[tuple[str, str]] = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        used |= read_names(tree)
        for line, name in defined_names(tree):
            where = f"{path.relative_to(package.parent)}:{line}: {name}"
            used.update([name] if line == 0 else [])  # exported: public API
            defined.append((where, name))
    return [where for where, name in defined if name not in used]


def test_the_check_finds_a_name_nothing_uses(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text(
        "__all__ = ['api']\nUSED = 1\nDEAD = 2\n_PRIVATE = 3\n\ndef api():\n    return USED\n\n"
        "def orphan():\n    pass\n"
    )
    page = tmp_path / "page.js"
    page.write_text("const x = 1;\n")
    assert unused(package, [page]) == [
        "pkg/a.py:3: DEAD",
        "pkg/a.py:9: orphan",
    ]
    page.write_text("DEAD(orphan);\n")
    assert unused(package, [page]) == []


def test_every_public_module_level_name_of_the_package_is_used():
    templates = PACKAGE / "reporters" / "templates"
    text = [  # their words: a name in a test, a tool or a page counts as used
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "tools").rglob("*.py"),
        *(ROOT / "integrations").rglob("*.py"),
        *templates.rglob("*.js"),
        *templates.rglob("*.j2"),
        ROOT / "pyproject.toml",
    ]
    found = unused(PACKAGE, text)
    assert found == [], "remove it, or name it in PUBLIC_API with why"
