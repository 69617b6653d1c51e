"""Imports point one way along the data flow (see docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "memscope"

# Which of memscope's rooms each room may import from (itself always allowed).
BASE = {"_version", "units", "downsample"}
ALLOWED: dict[str, set[str]] = {
    "_version": set(),
    "units": set(),
    "downsample": set(),
    "config": set(),
    "events": set(BASE),
    "io": BASE | {"events"},
    "capture": BASE | {"events", "config"},
    "analysis": BASE | {"events", "config"},
    "reporters": BASE | {"events"},
    "inputs": BASE | {"events", "config", "analysis"},
    "session": BASE | {"events", "config", "capture", "analysis", "reporters", "io"},
    "integrations": BASE | {"events", "config", "capture", "analysis", "inputs", "session", "io"},
    "demo": BASE | {"events", "config", "capture", "integrations"},
    "cli": BASE | {"events", "config", "analysis", "reporters", "io", "inputs", "demo"},
}


def _room(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "memscope" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if _room(p) not in ("__init__", "__main__"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_import_points_down_the_data_flow(path):
    room = _room(path)
    assert room in ALLOWED, f"{room}: a new room needs a place in docs/architecture.md"
    for line, target in _imports(path):
        if target != room:
            assert target in ALLOWED[room], f"{path.name}:{line}: {room} imports {target}"


# What reading a file takes: analysis/ is handed plain data and typed specs (inputs/ reads).
FILE_MODULES = {"os", "io", "json", "yaml", "pathlib", "glob", "importlib", "shutil", "pickle"}
ANALYSIS = sorted((PACKAGE / "analysis").rglob("*.py"))


@pytest.mark.parametrize("path", ANALYSIS, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_analysis_reads_no_files(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            names = []
        for name in names:
            assert name.split(".")[0] not in FILE_MODULES, f"{path.name}:{node.lineno}: {name}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id != "open", f"{path.name}:{node.lineno}: open()"
