"""patches/megatron-lm-0.19.patch on the real Megatron-LM 0.19 training.py and pretrain_gpt.py
(tests/data/megatron-lm-0.19/, unmodified copies of core_r0.19.0 at f8837c0, checked by their
git blob ids): the patch tool picks it by the tree's version, applies, checks and reverts it,
the patched loop calls every hook where the 0.15 patch does, and (CI's megatron-core 0.19
run, whose wheel ships the same training.py) the patched ``train_step`` traces real steps."""

from __future__ import annotations

import gzip
import hashlib
import os
import py_compile
import subprocess
from pathlib import Path

import pytest
from flagscale_trees import PATCHES, run_tool
from harness.patched_loop import assert_hooks_wrap_the_loop

DATA = Path(__file__).parent / "data" / "megatron-lm-0.19"
# path in the tree -> (stored copy, git blob id at f8837c04ef6cbef6cdefb8de001aad63178aebbf)
FILES = {
    "megatron/training/training.py": (
        "training.py.gz", "57b8efe9390eca9ca8596ed5bb073ed62d9d014d"
    ),
    "pretrain_gpt.py": ("pretrain_gpt.py.gz", "47c1935eb90ccac190b8c2934193e0d91bf99199"),
    "megatron/core/package_info.py": (
        "package_info.py.gz", "10ebd3d571b6efa12558cddc4480b6a8944aa004"
    ),
}  # fmt: skip
PATCHED = ["megatron/training/training.py", "pretrain_gpt.py"]


def _stored(name: str) -> bytes:
    data = (DATA / name).read_bytes()
    return gzip.decompress(data)


def _tree(tmp_path: Path) -> Path:
    """A Megatron-LM 0.19 tree holding the three stored files."""
    root = tmp_path / "Megatron-LM"
    for path, (name, _) in FILES.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(_stored(name))
    return root


def _patch(root: Path, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    text = (Path(PATCHES) / name).read_text(encoding="utf-8")
    return subprocess.run(["patch", "-p1", "--fuzz=0", "--batch", *extra], cwd=root,
                          input=text, capture_output=True, text=True)  # fmt: skip


def test_the_stored_files_are_the_commits_own():
    for name, blob in FILES.values():
        data = _stored(name)
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob, name


def test_the_019_patch_applies_exactly_and_the_015_one_does_not(tmp_path):
    root = _tree(tmp_path)
    assert _patch(root, "megatron-lm-0.15.0rc5.patch", "--dry-run").returncode != 0
    for extra in (["--dry-run"], []):  # the header's command: patch -p1 < FILE
        proc = _patch(root, "megatron-lm-0.19.patch", *extra)
        assert proc.returncode == 0 and "offset" not in proc.stdout, proc.stdout + proc.stderr
    assert not [p for p in root.rglob("*") if p.suffix in (".orig", ".rej")]
    for path in PATCHED:
        py_compile.compile(str(root / path), doraise=True)
    training = (root / "megatron/training/training.py").read_text(encoding="utf-8")
    assert_hooks_wrap_the_loop(training, returns=3)
    gpt = (root / "pretrain_gpt.py").read_text(encoding="utf-8")
    assert "extra_args_provider=with_memscope_args(" in gpt


def test_the_tool_picks_the_patch_by_the_trees_version(tmp_path):
    root = _tree(tmp_path)
    pristine = {p: (root / p).read_bytes() for p in PATCHED}
    before = run_tool("check", "--tree", str(root))
    assert before.returncode == 1, before.stderr
    assert "Megatron-LM 0.19.1 tree" in before.stdout and "megatron-lm-0.19.patch" in before.stdout
    applied = run_tool("apply", "--tree", str(root))
    assert applied.returncode == 0 and "memscope patch applied" in applied.stdout, applied.stderr
    assert all((root / p).read_bytes() != pristine[p] for p in PATCHED)
    reverted = run_tool("revert", "--tree", str(root))
    assert reverted.returncode == 0 and "reverted" in reverted.stdout, reverted.stderr
    assert {p: (root / p).read_bytes() for p in PATCHED} == pristine


@pytest.mark.parametrize(
    ("minor", "patch_name"),
    [("MINOR = 17", None), ("MINOR = 15", "megatron-lm-0.15.0rc5.patch")],
)
def test_another_release_gets_its_own_patch_or_one_line(tmp_path, minor, patch_name):
    root = _tree(tmp_path)
    info = root / "megatron/core/package_info.py"
    info.write_text(info.read_text(encoding="utf-8").replace("MINOR = 19", minor))
    proc = run_tool("check", "--tree", str(root))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1
    if patch_name is None:  # no patch for 0.17: said so, and which releases have one
        assert "is Megatron-LM 0.17.1; MemScope has patches for 0.15.0rc5, 0.19 only" in line
    else:  # a 0.15 version file on 0.19 code: the 0.15 patch is chosen and does not match
        assert f"{patch_name} does not match the Megatron-LM 0.15.1 tree" in line
    os.remove(info)
    missing = run_tool("check", "--tree", str(root))
    assert missing.returncode == 2 and "cannot read the Megatron-LM version" in missing.stderr


def _installed_training_py() -> Path:
    """The installed megatron-core's own ``megatron/training/training.py`` when it is the
    core_r0.19.0 file (the megatron-core 0.19.2 wheel ships it), else skip (fail under
    ``MEMSCOPE_REQUIRE_MEGATRON_VERSIONS=1``, as in CI's 0.19 run)."""
    import importlib.util

    spec = importlib.util.find_spec("megatron.core")
    path = Path(spec.origin).parent.parent / "training" / "training.py" if spec else None
    if path is None or not path.is_file() or path.read_bytes() != _stored("training.py.gz"):
        reason = "no installed megatron-core ships core_r0.19.0's megatron/training/training.py"
        if os.environ.get("MEMSCOPE_REQUIRE_MEGATRON_VERSIONS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.mark.megatron_versions
@pytest.mark.multiprocess  # a training script in a subprocess
def test_the_patched_train_step_traces_every_step_on_megatron_core_019(tmp_path):
    import json
    import subprocess
    import sys

    from memscope.demo.launcher import free_port

    installed = _installed_training_py()
    root = tmp_path / "tree"
    (root / "megatron/training").mkdir(parents=True)
    (root / "megatron/training/training.py").write_bytes(installed.read_bytes())
    (root / "pretrain_gpt.py").write_bytes(_stored("pretrain_gpt.py.gz"))
    assert _patch(root, "megatron-lm-0.19.patch").returncode == 0
    out = tmp_path / "out"
    out.mkdir()
    worker = Path(__file__).parent / "megatron_lm_019_train_step_worker.py"
    env = dict(os.environ, MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(worker), str(root / "megatron/training/training.py"), str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = json.loads((out / "result.json").read_text(encoding="utf-8"))
    assert [s["skipped"] for s in steps] == [0, 0, 0]
    assert all(s["loss"] is not None and 0 < s["loss"] < 20 for s in steps)
    report = json.loads((out / "memscope/rank00000/runtime_report.json").read_text())
    assert report["status"] == "complete", report["status_reason"]
    phases = [(e["step"], e["phase"], e["notes"]) for e in report["runtime_trace"]
              if e["event_type"] == "step_phase"]  # fmt: skip
    # each patched call: forward_backward_end, optimizer_step_start/_end, step_end
    for step in range(3):
        assert [p[1:] for p in phases if p[0] == step] == [
            ("forward_backward", ""), ("pre_optimizer", ""), ("optimizer", ""),
            ("step", "last pipeline stage"),
        ]  # fmt: skip
