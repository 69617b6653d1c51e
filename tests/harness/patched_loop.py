"""Test helper: where a patched Megatron-LM / FlagScale ``training.py`` calls MemScope.

Reads the patched source with :mod:`ast` (nothing is imported or run) and asserts the shape
every patch in ``patches/`` must give ``train_step`` and ``train``: a ``step_end`` hook right
before every ``return`` of ``train_step``; ``step_start`` and ``forward_backward_end`` before
``optimizer_step_start``, and ``optimizer.step()`` between that and ``optimizer_step_end``;
``start`` before ``finalize`` in ``train``, ``finalize`` once and before every ``sys.exit``,
with no ``return`` between the two.
"""

from __future__ import annotations

import ast


def guarded_hook_call(node: ast.stmt) -> str | None:
    """``if memscope_hooks is not None: memscope_hooks.NAME(...)`` -> NAME, else None."""
    if not (isinstance(node, ast.If) and ast.unparse(node.test) == "memscope_hooks is not None"):
        return None
    call = node.body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
    return ast.unparse(call.value.func).removeprefix("memscope_hooks.")


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def assert_hooks_wrap_the_loop(source: str, returns: int) -> None:
    """The shape in the module docstring; ``returns``: how many ``train_step`` has."""
    module = ast.parse(source)
    step = _function(module, "train_step")
    seen = 0
    for parent in ast.walk(step):
        for field in ("body", "orelse"):
            body = getattr(parent, field, None)
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.Return):
                    seen += 1
                    assert i > 0 and guarded_hook_call(body[i - 1]) == "step_end", stmt.lineno
    assert seen == returns
    names = [guarded_hook_call(s) for s in step.body]
    opt_start, opt_end = names.index("optimizer_step_start"), names.index("optimizer_step_end")
    assert names.index("step_start") < opt_start
    assert names.index("forward_backward_end") < opt_start
    between = step.body[opt_start + 1 : opt_end]
    assert any("optimizer.step()" in ast.unparse(s) for s in between)
    assert not any(guarded_hook_call(s) for s in between)

    train = _function(module, "train")
    calls = [guarded_hook_call(s) for s in train.body]
    start, finalize = calls.index("start"), calls.index("finalize")
    exits = [i for i, s in enumerate(train.body) if "sys.exit(" in ast.unparse(s)]
    assert isinstance(train.body[-1], ast.Return) and exits
    assert start < finalize < min(exits) and calls.count("finalize") == 1
    assert not any(isinstance(s, ast.Return) for s in train.body[start:finalize])
