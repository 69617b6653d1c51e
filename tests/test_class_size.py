"""No class in the package (adapters in memscope/integrations/ included) is over 300 lines:
a class that big holds more than one job (issue 26 item 3)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "memscope"
MAX_CLASS_LINES = 300


def class_sizes(path: Path) -> list[tuple[str, int]]:
    """Every class defined in ``path`` (nested ones too) with its length in lines, from
    its first decorator to its last line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            assert node.end_lineno is not None
            out.append((node.name, node.end_lineno - first + 1))
    return out


def oversized(package: Path, limit: int) -> list[str]:
    """``file: Class (N lines)`` for every class of ``package`` longer than ``limit``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        for name, lines in class_sizes(path):
            if lines > limit:
                found.append(f"{rel}: {name} ({lines} lines)")
    return found


def test_no_class_in_the_package_is_over_300_lines():
    assert oversized(PACKAGE, MAX_CLASS_LINES) == []


def test_the_walk_finds_and_measures_classes(tmp_path):
    src = tmp_path / "pkg"
    src.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    (src / "big.py").write_text(f"@decorated\nclass Big:\n{body}\n\nclass Small:\n    pass\n")
    (src / "sub").mkdir()
    (src / "sub" / "nested.py").write_text(
        f"def f():\n    class Inner:\n    {body.replace(chr(10), chr(10) + '    ')}\n"
    )
    assert class_sizes(src / "big.py") == [("Big", MAX_CLASS_LINES + 2), ("Small", 2)]
    assert oversized(src, MAX_CLASS_LINES) == [
        f"big.py: Big ({MAX_CLASS_LINES + 2} lines)",
        f"sub/nested.py: Inner ({MAX_CLASS_LINES + 1} lines)",
    ]
    assert oversized(src, MAX_CLASS_LINES + 2) == []
