"""The unit / integration split is checked while tests run (tests/layer_guard.py): a unit test
that uses an integration resource fails naming it, and the same test marked integration passes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from layer_guard import TESTS_DIR, in_flagscale_tree, integration_command

_CONFTEST = f"""
import sys
sys.path.insert(0, {TESTS_DIR!r})
from layer_guard import LayerGuard

def pytest_configure(config):
    guard = LayerGuard()
    guard.install(process_groups=False)
    config.pluginmanager.register(guard, "memscope-layer-guard")
"""

# Reads a file of a FlagScale tree: directly in the test, and through a module fixture that a
# second test only depends on (set up once, before it).
_TESTS = """
import pytest

def _read_tree(tmp):
    tree = tmp / "flag_scale" / "examples"
    tree.mkdir(parents=True)
    (tree / "train.yaml").write_text("system: {}")
    return (tree / "train.yaml").read_text()

@pytest.fixture(scope="module")
def tree_yaml(tmp_path_factory):
    return _read_tree(tmp_path_factory.mktemp("t"))

def test_reads_the_tree{args}:
    assert _read_tree(tmp_path)

def test_first_user(tree_yaml):
    assert tree_yaml

def test_later_user(tree_yaml):
    assert tree_yaml

def test_plain(tmp_path):
    assert not (tmp_path / "x").exists()
"""


def _run(tmp_path, mark: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(_CONFTEST)
    body = textwrap.dedent(_TESTS).replace("{args}", "(tmp_path)")
    (tmp_path / "test_toy.py").write_text(mark + body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
         "--basetemp", str(tmp_path / "base"), "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip


def test_a_unit_test_that_reads_the_flagscale_tree_fails_naming_it(tmp_path):
    _run(tmp_path, "")  # again: the toy's old tree in --basetemp is removed, not used
    res = _run(tmp_path, "")
    assert res.returncode == 1, res.stdout[-3000:]
    failed = [line for line in res.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    names = {line.split("::")[1].split(" ")[0] for line in failed}
    # the fixture's user fails in setup (an error), the later user by depending on it
    assert names == {"test_reads_the_tree", "test_first_user", "test_later_user"}, res.stdout
    assert "is a unit test but used the FlagScale tree" in res.stdout
    assert "the fixture 'tree_yaml' (the FlagScale tree)" in res.stdout
    assert "3 passed" not in res.stdout and "1 passed" in res.stdout


def test_the_same_tests_marked_integration_pass(tmp_path):
    res = _run(tmp_path, "import pytest\npytestmark = pytest.mark.integration\n")
    assert res.returncode == 0 and "4 passed" in res.stdout, res.stdout[-3000:]


def test_commands_that_train_or_browse_are_integration_and_offline_ones_are_not():
    worker = os.path.join(TESTS_DIR, "crash_script.py")
    assert integration_command([sys.executable, worker, "/tmp/x", "oom"])
    assert integration_command(["/usr/bin/chromium", "--headless", "--dump-dom", "x.html"])
    assert integration_command(["memscope", "demo", "--steps", "2"])
    assert integration_command([sys.executable, "-m", "memscope.cli", "demo"])
    assert integration_command(["torchrun", "--nproc-per-node", "2", "train.py"])
    assert integration_command([sys.executable, "tool.py", "/c/flag_scale-0.8.0/tree/flag_scale"])
    assert integration_command([sys.executable, "-m", "memscope.cli", "summarize"]) is None
    assert integration_command([sys.executable, "-c", "import time"]) is None
    assert integration_command(["git", "check-ignore", "-q", "memscope_demo/x"]) is None


def test_only_what_is_in_a_folder_named_flag_scale_is_the_tree():
    assert in_flagscale_tree("/root/.cache/memscope/flag_scale-0.8.0/tree/flag_scale/run.py")
    assert in_flagscale_tree(b"/tmp/copy/flag_scale/examples", root_too=True)
    assert in_flagscale_tree(b"/tmp/copy/flag_scale", root_too=True)
    assert not in_flagscale_tree("flag_scale")  # shutil.rmtree opens a folder it removes
    assert not in_flagscale_tree("/work/memscope/integrations/flagscale/README.md")
    assert not in_flagscale_tree("/tmp/flag_scale-0.8.0/wheel.whl") and not in_flagscale_tree(3)
