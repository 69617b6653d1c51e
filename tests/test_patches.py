"""patches/ on the real FlagScale 0.8.0 wheel: dry run, apply, compile, check, revert, refuse."""

from __future__ import annotations

import ast
import os
import py_compile
import subprocess

import pytest
from flagscale_trees import (
    MEGATRON,
    PATCHES,
    WHEEL_SHA256,
    cached_wheel,
    patched_tree,
    pristine_tree,
    run_tool,
    sha256,
    tree_copy,
)

pytestmark = pytest.mark.integration

# (patch file, tree root relative to the FlagScale root, files the patch changes)
PATCH_SETS = [
    ("flagscale-0.8.0.patch", "", ["flagscale/train/train.py", "flagscale/train/train_gpt.py"]),
    (
        "megatron-lm-0.15.0rc5.patch",
        MEGATRON,
        ["megatron/training/training.py", "pretrain_gpt.py"],
    ),
]
TRAINING_FILES = [
    os.path.join("flagscale", "train", "train.py"),
    os.path.join(MEGATRON, "megatron", "training", "training.py"),
]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_the_cached_wheel_is_the_pinned_release():
    wheel = cached_wheel()
    if wheel is None:
        pytest.skip("tree given by MEMSCOPE_FLAGSCALE_TREE: no wheel to check")
    assert sha256(wheel) == WHEEL_SHA256
    tree = pristine_tree()
    for _, sub, files in PATCH_SETS:
        for name in files:
            assert os.path.isfile(os.path.join(tree, sub, name)), name
    version = _read(os.path.join(tree, MEGATRON, "megatron", "core", "package_info.py"))
    assert b"MINOR = 15" in version and b"PRE_RELEASE = 'rc5'" in version


@pytest.mark.parametrize(("patch_name", "sub", "files"), PATCH_SETS)
def test_patch_applies_dry_run_then_for_real_and_compiles(tmp_path, patch_name, sub, files):
    root = os.path.join(tree_copy(str(tmp_path)), sub)
    with open(os.path.join(PATCHES, patch_name), encoding="utf-8") as f:
        text = f.read()
    for extra in (["--dry-run"], []):  # exactly the README's command: patch -p1 < FILE
        proc = subprocess.run(
            ["patch", "-p1", "--fuzz=0", *extra],
            cwd=root,
            input=text,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    leftovers = [
        name for _, _, names in os.walk(root) for name in names if name.endswith((".orig", ".rej"))
    ]
    assert not leftovers, "patch left backup or reject files behind"
    for name in files:
        py_compile.compile(os.path.join(root, name), doraise=True)
    check = run_tool("check", "--tree", root)
    assert check.returncode == 0 and "memscope patch applied" in check.stdout


@pytest.mark.parametrize(("patch_name", "sub", "files"), PATCH_SETS)
def test_tool_apply_is_idempotent_and_revert_restores_every_byte(tmp_path, patch_name, sub, files):
    root = os.path.join(tree_copy(str(tmp_path)), sub)
    pristine = {n: _read(os.path.join(pristine_tree(), sub, n)) for n in files}

    before = run_tool("check", "--tree", root)
    assert before.returncode == 1 and "not applied" in before.stdout
    first = run_tool("apply", "--tree", root)
    assert first.returncode == 0 and "memscope patch applied" in first.stdout, first.stderr
    assert all(_read(os.path.join(root, n)) != pristine[n] for n in files)
    again = run_tool("apply", "--tree", root)
    assert again.returncode == 0 and "already applied" in again.stdout

    reverted = run_tool("revert", "--tree", root)
    assert reverted.returncode == 0 and "reverted" in reverted.stdout, reverted.stderr
    assert {n: _read(os.path.join(root, n)) for n in files} == pristine
    nothing = run_tool("revert", "--tree", root)
    assert nothing.returncode == 0 and "nothing to revert" in nothing.stdout


def _refusal(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memscope_patch: refused: ")
    return lines[0]


def test_tool_refuses_trees_it_does_not_match(tmp_path):
    fs_root = tree_copy(str(tmp_path))
    (tmp_path / "empty").mkdir()
    empty = _refusal(run_tool("apply", "--tree", str(tmp_path / "empty")))
    assert "neither a FlagScale tree" in empty
    assert "not a directory" in _refusal(run_tool("check", "--tree", str(tmp_path / "nope")))
    parent = _refusal(run_tool("check", "--tree", str(tmp_path)))
    assert f"did you mean --tree {fs_root}" in parent
    wrong = _refusal(run_tool("apply", "--tree", fs_root, "--target", "megatron-lm"))
    assert "not a Megatron-LM 0.15.0rc5 tree" in wrong and MEGATRON in wrong

    # A locally edited file: refused as a whole, nothing is touched.
    train = os.path.join(fs_root, "flagscale", "train", "train.py")
    gpt = os.path.join(fs_root, "flagscale", "train", "train_gpt.py")
    with open(train, encoding="utf-8") as f:
        text = f.read()
    edited = text.replace("    timers = get_timers()\n", "    timers = get_timers()  # local\n")
    assert edited != text
    with open(train, "w", encoding="utf-8") as f:
        f.write(edited)
    gpt_before = _read(gpt)
    line = _refusal(run_tool("apply", "--tree", fs_root))
    assert "does not match" in line and "flagscale/train/train.py: does not match" in line
    assert _read(gpt) == gpt_before
    assert _refusal(run_tool("check", "--tree", fs_root))


def _guarded_hook_call(node: ast.stmt) -> str | None:
    """``if memscope_hooks is not None: memscope_hooks.NAME(...)`` -> NAME, else None."""
    if not (isinstance(node, ast.If) and ast.unparse(node.test) == "memscope_hooks is not None"):
        return None
    call = node.body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
    return ast.unparse(call.value.func).removeprefix("memscope_hooks.")


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.parametrize("relpath", TRAINING_FILES)
def test_every_return_of_train_step_and_exit_of_train_is_preceded_by_a_hook(relpath):
    with open(os.path.join(patched_tree(), relpath), encoding="utf-8") as f:
        module = ast.parse(f.read())
    step = _function(module, "train_step")
    returns = 0
    for parent in ast.walk(step):
        for field in ("body", "orelse"):
            body = getattr(parent, field, None)
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.Return):
                    returns += 1
                    assert i > 0 and _guarded_hook_call(body[i - 1]) == "step_end", stmt.lineno
    assert returns == (4 if "flagscale" in relpath else 3)
    names = [_guarded_hook_call(s) for s in step.body]
    assert names.index("step_start") < names.index("optimizer_step_start")
    assert names.index("forward_backward_end") < names.index("optimizer_step_start")
    assert names.index("optimizer_step_start") + 4 == names.index("optimizer_step_end")

    train = _function(module, "train")
    calls = [_guarded_hook_call(s) for s in train.body]
    start, finalize = calls.index("start"), calls.index("finalize")
    exits = [i for i, s in enumerate(train.body) if "sys.exit(" in ast.unparse(s)]
    assert isinstance(train.body[-1], ast.Return) and exits
    assert start < finalize < min(exits) and calls.count("finalize") == 1
    assert not any(isinstance(s, ast.Return) for s in train.body[start:finalize])
