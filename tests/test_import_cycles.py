"""No import circle in the package: the module import graph of memscope/ is acyclic.

Every ``import`` / ``from ... import`` statement of every module counts, wherever it is:
at module level, inside a function (a deferred import still ties the two modules together),
and under ``if TYPE_CHECKING:`` (a type named there is a dependency the design has, even if
it is only resolved by the type checker). ``from pkg import name`` points at the submodule
``pkg.name`` when there is one, else at ``pkg``. Not counted: the implicit import of a
module's parent packages (``import a.b.c`` runs ``a/__init__`` and ``a/b/__init__``), since
a package's ``__init__`` re-exporting its own submodules would otherwise make every package a
circle of itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "memscope"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a (possibly relative) ``from`` import names."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package modules it imports (every import statement, see above)."""
    paths = {module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, name, path.name == "__init__.py")
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in paths else base)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (``[a, b, ..., a]``), or None when the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_package_has_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_graph_holds_deferred_and_type_checking_imports():
    graph = import_graph()
    # a function-level import (cli/diff_cmd.py imports the pages module inside run())
    assert "memscope.cli.pages" in graph["memscope.cli.diff_cmd"]
    # an import under TYPE_CHECKING only (workspaces names TrainingSpec for its annotations)
    assert "memscope.analysis.static.config" in graph["memscope.analysis.static.workspaces"]
    # `from memscope.cli import pages` is an edge to the submodule, not to the package
    assert "memscope.cli" not in graph["memscope.cli.diff_cmd"]


def test_a_circle_is_found_and_named(tmp_path):
    package = tmp_path / "memscope"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from memscope.sub.b import thing\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import other\n"
    )
    (package / "sub" / "c.py").write_text("def f():\n    from memscope.sub import a\n")
    graph = import_graph(package)
    cycle = ["memscope.sub.a", "memscope.sub.b", "memscope.sub.c", "memscope.sub.a"]
    assert find_cycle(graph) == cycle
    (package / "sub" / "c.py").write_text("def f():\n    return 1\n")
    assert find_cycle(import_graph(package)) is None
