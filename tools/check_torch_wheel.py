"""Checks that a torch wheel has every torch API MemScope calls, without installing it.

    pip download --no-deps torch==2.7.1 --python-version 3.11 --only-binary=:all: \
        --platform manylinux_2_28_x86_64 -d /tmp/torch271
    python tools/check_torch_wheel.py /tmp/torch271/torch-2.7.1-*.whl

Python-level APIs are looked up in the wheel's sources (``def`` and its parameters, by
``ast``); C bindings in the ``torch._C`` stubs or, failing that, the names compiled into
``libtorch_python.so``. Prints one line per API and exits 1 if any is missing.
"""

from __future__ import annotations

import argparse
import ast
import sys
import zipfile

#: (file in the wheel, class or "" for module level, function, keywords MemScope passes)
PYTHON_APIS = (
    ("torch/cuda/memory.py", "", "_record_memory_history", ("enabled",)),
    ("torch/cuda/memory.py", "", "_record_memory_history_impl",
     ("enabled", "context", "stacks", "max_entries")),
    ("torch/cuda/memory.py", "", "_snapshot", ()),
    ("torch/cuda/memory.py", "", "_dump_snapshot", ()),
    ("torch/cuda/memory.py", "", "mem_get_info", ()),
    ("torch/cuda/memory.py", "", "memory_stats", ()),
    ("torch/cuda/memory.py", "", "reset_peak_memory_stats", ()),
    ("torch/_tensor.py", "Tensor", "register_post_accumulate_grad_hook", ()),
    ("torch/nn/modules/module.py", "Module", "register_forward_hook",
     ("with_kwargs", "always_call")),
    ("torch/nn/modules/module.py", "Module", "register_forward_pre_hook", ("with_kwargs",)),
    ("torch/utils/_python_dispatch.py", "TorchDispatchMode", "__torch_dispatch__", ()),
)  # fmt: skip
#: torch._C bindings MemScope reaches through getattr.
C_APIS = ("_current_graph_task_id", "_cuda_attach_out_of_memory_observer")


def _function(tree: ast.Module, owner: str, name: str) -> ast.FunctionDef | None:
    scope: list[ast.stmt] = tree.body
    if owner:
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner]
        scope = classes[0].body if classes else []
    for node in scope:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _accepts(fn: ast.FunctionDef, keywords: tuple[str, ...]) -> list[str]:
    a = fn.args
    names = {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    return [] if a.kwarg is not None else [k for k in keywords if k not in names]


def check(wheel: str) -> list[tuple[str, str | None]]:
    """(API, why it is missing or None) for every API."""
    out: list[tuple[str, str | None]] = []
    with zipfile.ZipFile(wheel) as zf:
        for path, owner, name, keywords in PYTHON_APIS:
            label = f"{path}:{owner + '.' if owner else ''}{name}"
            fn = _function(ast.parse(zf.read(path)), owner, name)
            if fn is None:
                out.append((label, "not defined"))
                continue
            lacking = _accepts(fn, keywords)
            out.append((label, f"takes no {', '.join(lacking)}" if lacking else None))
        stubs = zf.read("torch/_C/__init__.pyi").decode()
        library = None
        for name in C_APIS:
            if f"def {name}(" in stubs:
                out.append((f"torch._C.{name}", None))
                continue
            if library is None:
                library = zf.read("torch/lib/libtorch_python.so")
            found = name.encode() in library
            out.append((f"torch._C.{name}", None if found else "not compiled in"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("wheel", help="a torch wheel (.whl)")
    ns = parser.parse_args(argv)
    results = check(ns.wheel)
    for api, problem in results:
        print(
            f"{'ok     ' if problem is None else 'MISSING'} {api}"
            + (f": {problem}" if problem else "")
        )
    missing = sum(problem is not None for _, problem in results)
    print(
        f"{len(results) - missing} of {len(results)} APIs present in {ns.wheel.rsplit('/', 1)[-1]}"
    )
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
