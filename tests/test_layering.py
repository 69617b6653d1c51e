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
    "report": BASE | {"events", "config", "analysis", "reporters"},
    "session": BASE | {"events", "config", "capture", "analysis", "reporters", "report", "io"},
    "integrations": BASE | {"events", "config", "capture", "analysis", "inputs", "session", "io"},
    "demo": BASE | {"events", "config", "capture", "integrations"},
    "cli": BASE | {"events", "config", "analysis", "reporters", "report", "io", "inputs", "demo"},
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


# -- device access only in capture/ (issue 26 item 4) -----------------------------------------
#: Modules outside capture/ allowed to name ``torch.cuda``, each with why it is not MemScope's
#: own device access.
CUDA_NAMED_ELSEWHERE = {
    # the CPU stand-in for the ``torch.cuda`` megatron-core's modules see (demo and tests only):
    # it forwards what it does not redirect to the real module
    "demo/megatron_cpu_shims.py",
}


def _reaches_cuda(node: ast.AST) -> bool:
    """``torch.cuda`` as an attribute, or an import of it (or of something in it)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "cuda" and isinstance(node.value, ast.Name) and node.value.id == "torch"
    if isinstance(node, ast.ImportFrom) and node.module:
        named = node.module == "torch" and any(a.name == "cuda" for a in node.names)
        return named or node.module.startswith("torch.cuda")
    if isinstance(node, ast.Import):
        return any(a.name.startswith("torch.cuda") for a in node.names)
    return False


def _cuda_uses(source: str) -> list[int]:
    """Lines of ``source`` that reach ``torch.cuda``."""
    return sorted(n.lineno for n in ast.walk(ast.parse(source)) if _reaches_cuda(n))


def test_the_cuda_finder_sees_every_way_of_reaching_torch_cuda():
    assert _cuda_uses("import torch\nok = torch.cuda.is_available()") == [2]
    assert _cuda_uses("from torch import cuda") == [1]
    assert _cuda_uses("from torch.cuda import memory_stats") == [1]
    assert _cuda_uses("import torch.cuda.memory") == [1]
    assert _cuda_uses("'torch.cuda in a docstring'\nimport torch\ntorch.device('cuda')") == []


def test_only_capture_touches_the_device():
    outside = [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if _room(p) != "capture" and str(p.relative_to(PACKAGE)) not in CUDA_NAMED_ELSEWHERE
    ]
    assert len(outside) > 50  # the whole package but capture/ is checked
    uses = {
        str(p.relative_to(PACKAGE)): lines for p in outside if (lines := _cuda_uses(p.read_text()))
    }
    assert uses == {}, f"torch.cuda outside capture/ (use memscope.capture.device): {uses}"


# -- a small session and a thin adapter (issue 26 item 3) -------------------------------------
def _class_lines(path: Path, name: str) -> int:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            assert node.end_lineno is not None
            return node.end_lineno - node.lineno + 1
    raise AssertionError(f"no class {name} in {path}")


def test_the_tracing_session_is_a_lifecycle_core_of_at_most_250_lines():
    assert _class_lines(PACKAGE / "session" / "session.py", "TracingSession") <= 250


def test_the_megatron_adapter_is_at_most_200_lines():
    runtime = PACKAGE / "integrations" / "megatron" / "runtime.py"
    assert len(runtime.read_text().splitlines()) <= 200


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
