"""patches/ on the real FlagScale 0.8.0 wheel: dry run, apply, compile, check, revert, refuse."""

from __future__ import annotations

import importlib
import os
import py_compile
import shutil
import stat
import subprocess
import sys

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
from harness.patched_loop import assert_hooks_wrap_the_loop

memscope_patch = importlib.import_module(
    "memscope_patch"
)  # tools/, on sys.path via flagscale_trees

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
    assert "not a Megatron-LM tree" in wrong and MEGATRON in wrong

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


@pytest.mark.parametrize("relpath", TRAINING_FILES)
def test_every_return_of_train_step_and_exit_of_train_is_preceded_by_a_hook(relpath):
    with open(os.path.join(patched_tree(), relpath), encoding="utf-8") as f:
        assert_hooks_wrap_the_loop(f.read(), returns=4 if "flagscale" in relpath else 3)


# --- atomicity: nothing is changed unless everything can be, and a failure rolls back --------


def _files_state(root: str, files: list[str]) -> dict[str, tuple[bytes, int]]:
    """Bytes and permission bits of each target."""
    return {
        n: (_read(os.path.join(root, n)), stat.S_IMODE(os.stat(os.path.join(root, n)).st_mode))
        for n in files
    }


def _listing(root: str, files: list[str]) -> dict[str, list[str]]:
    """The names in each target's directory (patch's leftovers would show up here)."""
    dirs = {os.path.dirname(os.path.join(root, n)) for n in files}
    return {d: sorted(os.listdir(d)) for d in dirs}


def _leftovers(root: str) -> list[str]:
    return [
        os.path.join(d, n)
        for d, _, names in os.walk(root)
        for n in names
        if n.endswith((".orig", ".rej", "~"))
    ]


def _main(capsys, *argv: str) -> tuple[int, str]:
    """The tool in this process (so a test can make a call fail); (exit status, stderr)."""
    code = memscope_patch.main(list(argv))
    return code, capsys.readouterr().err


def _one_line(code: int, err: str, prefix: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"memscope_patch: {prefix}: "), err
    return lines[0]


def _unprivileged_access(monkeypatch) -> None:
    """Root writes through ``chmod a-w``: answer ``os.access`` from the mode bits, as for users."""
    if os.geteuid() != 0:
        return
    real = os.access

    def access(path, mode, *args, **kwargs):
        if mode & os.W_OK and not os.stat(path).st_mode & stat.S_IWUSR:
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


@pytest.mark.parametrize("what", ["file", "directory"])
def test_unwritable_target_is_refused_before_any_change(tmp_path, monkeypatch, capsys, what):
    root = tree_copy(str(tmp_path))
    files = PATCH_SETS[0][2]
    unwritable = (
        os.path.join(root, files[1])
        if what == "file"
        else os.path.dirname(os.path.join(root, files[1]))
    )
    mode = stat.S_IMODE(os.stat(unwritable).st_mode)
    _unprivileged_access(monkeypatch)
    for action in ("apply", "revert"):
        if action == "revert":
            assert _main(capsys, "apply", "--tree", root)[0] == 0
        before, names = _files_state(root, files), _listing(root, files)
        os.chmod(unwritable, 0o444 if what == "file" else 0o555)
        try:
            if os.geteuid() != 0:  # the real thing, as a user runs it
                line = _refusal(run_tool(action, "--tree", root))
                assert f"{unwritable} cannot be written" in line
            line = _one_line(*_main(capsys, action, "--tree", root), "refused")
            assert f"{unwritable} cannot be written" in line and "nothing was changed" in line
            # check only reads: it still answers
            assert _main(capsys, "check", "--tree", root)[0] == (1 if action == "apply" else 0)
        finally:
            os.chmod(unwritable, mode)
        assert _files_state(root, files) == before
        assert _listing(root, files) == names


def test_symlinked_target_is_refused_before_any_change(tmp_path):
    """patch itself would patch train_gpt.py and refuse train.py: half a patch."""
    root = tree_copy(str(tmp_path))
    train = os.path.join(root, "flagscale", "train", "train.py")
    gpt = os.path.join(root, "flagscale", "train", "train_gpt.py")
    real = str(tmp_path / "train.py")
    os.replace(train, real)
    os.symlink(real, train)
    gpt_before, real_before = _read(gpt), _read(real)
    for action in ("apply", "check"):
        line = _refusal(run_tool(action, "--tree", root))
        assert f"{train} is a symbolic link" in line
    assert os.path.islink(train) and _read(real) == real_before and _read(gpt) == gpt_before
    assert not _leftovers(root)


_FAKE_PATCH = r"""#!{python}
# patch that gets half-way: the dry run is the real one; the real run patches the first
# file of the patch only, leaves patch's backup and reject files next to it, and exits {rc}.
import subprocess, sys
args, text = sys.argv[1:], sys.stdin.read()
if "--dry-run" in args:
    sys.exit(subprocess.run([{real!r}, *args], input=text, text=True).returncode)
first = "--- " + text.split("\n--- ")[1] + "\n"
name = first.split("\n")[0][4:].split("\t")[0].strip().split("/", 1)[1]
subprocess.run([{real!r}, *args], input=first, text=True, check=True)
for suffix in (".orig", ".rej"):
    with open(name + suffix, "w") as f:
        f.write("left behind\n")
open({ran!r}, "a").write(" ".join(args) + "\n")
print("fake patch: No space left on device", file=sys.stderr)
sys.exit({rc})
"""


def _fake_patch_first_on_path(tmp_path, monkeypatch, rc: int) -> str:
    """Put a half-way ``patch`` (see _FAKE_PATCH) first on PATH; returns its log file."""
    real, ran = shutil.which("patch"), str(tmp_path / "fake-patch-ran")
    assert real is not None
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    fake = bindir / "patch"
    fake.write_text(_FAKE_PATCH.format(python=sys.executable, real=real, ran=ran, rc=rc))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return ran


@pytest.mark.parametrize("rc", [1, 0], ids=["patch-fails", "patch-claims-success"])
@pytest.mark.parametrize(("patch_name", "sub", "files"), PATCH_SETS)
def test_failure_mid_apply_restores_every_file_and_apply_works_again(
    tmp_path, monkeypatch, patch_name, sub, files, rc
):
    root = os.path.join(tree_copy(str(tmp_path)), sub)
    before, names = _files_state(root, files), _listing(root, files)
    ran = _fake_patch_first_on_path(tmp_path, monkeypatch, rc)

    proc = run_tool("apply", "--tree", root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memscope_patch: error: apply failed ")
    assert "rolled back" in lines[0] and f"restored {files[0]} byte for byte" in lines[0]
    assert f"{files[0]}.orig" in lines[0] and f"{files[0]}.rej" in lines[0]
    with open(ran, encoding="utf-8") as f:  # the fake did patch the first file for real
        assert f.read().count("\n") == 1
    assert _files_state(root, files) == before
    assert _listing(root, files) == names and not _leftovers(root)

    monkeypatch.undo()  # the real patch again
    check = run_tool("check", "--tree", root)
    assert check.returncode == 1 and "not applied" in check.stdout, check.stderr
    again = run_tool("apply", "--tree", root)
    assert again.returncode == 0 and "memscope patch applied" in again.stdout, again.stderr
    assert run_tool("check", "--tree", root).returncode == 0
    assert not _leftovers(root)


@pytest.mark.parametrize(("patch_name", "sub", "files"), PATCH_SETS)
def test_failure_mid_revert_restores_the_patched_files(
    tmp_path, monkeypatch, patch_name, sub, files
):
    root = os.path.join(tree_copy(str(tmp_path)), sub)
    pristine = _files_state(root, files)
    assert run_tool("apply", "--tree", root).returncode == 0
    patched, names = _files_state(root, files), _listing(root, files)
    _fake_patch_first_on_path(tmp_path, monkeypatch, 1)

    proc = run_tool("revert", "--tree", root)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("memscope_patch: error: revert failed (patch exited 1: ")
    assert "rolled back" in proc.stderr
    assert _files_state(root, files) == patched
    assert _listing(root, files) == names and not _leftovers(root)

    monkeypatch.undo()
    check = run_tool("check", "--tree", root)
    assert check.returncode == 0 and "memscope patch applied" in check.stdout, check.stderr
    reverted = run_tool("revert", "--tree", root)
    assert reverted.returncode == 0 and "reverted" in reverted.stdout, reverted.stderr
    assert _files_state(root, files) == pristine and not _leftovers(root)


@pytest.mark.parametrize(
    "error",
    [KeyboardInterrupt(), OSError(28, "No space left on device")],
    ids=["keyboard-interrupt", "write-fails"],
)
@pytest.mark.parametrize("action", ["apply", "revert"])
def test_interrupt_or_error_after_patch_wrote_rolls_back(
    tmp_path, monkeypatch, capsys, error, action
):
    """An exception in the tool itself once patch changed the files (Ctrl-C, a failed write)."""
    files = PATCH_SETS[0][2]
    root = tree_copy(str(tmp_path))
    if action == "revert":
        assert _main(capsys, "apply", "--tree", root)[0] == 0
    before, names = _files_state(root, files), _listing(root, files)
    real_run_patch = memscope_patch.run_patch

    def run_patch(tree, text, *args):
        proc = real_run_patch(tree, text, *args)
        if "--dry-run" not in args:  # patch has written every file: now fail
            with open(os.path.join(tree, files[0] + ".orig"), "wb") as f:
                f.write(b"backup")
            raise error
        return proc

    monkeypatch.setattr(memscope_patch, "run_patch", run_patch)
    line = _one_line(*_main(capsys, action, "--tree", root), "error")
    why = "interrupted" if isinstance(error, KeyboardInterrupt) else "No space left on device"
    assert f"{action} failed ({'OSError: ' * isinstance(error, OSError)}" in line
    assert why in line and "rolled back" in line
    assert f"restored {files[0]}, {files[1]} byte for byte, removed {files[0]}.orig" in line
    assert _files_state(root, files) == before
    assert _listing(root, files) == names and not _leftovers(root)

    monkeypatch.undo()
    code, _ = _main(capsys, "check", "--tree", root)
    assert code == (1 if action == "apply" else 0)
