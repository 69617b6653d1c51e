"""The pages' script files (memscope/reporters/templates/js/) pass their unit tests under node
(``node --test tests/js/``, node 20's built-in runner), so CI runs them with the rest."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from memscope.units import NUMBER_RULES

ROOT = Path(__file__).resolve().parent.parent
NODE = shutil.which("node")


def _node() -> str:
    """The node binary; where there is none, a skip (saying so), or under CI a failure."""
    if NODE is None:
        if os.environ.get("CI"):
            pytest.fail("no node binary under CI (.ci/run installs nodejs)")
        pytest.skip("no node binary: the pages' JavaScript unit tests need node >= 20")
    return NODE


def test_page_scripts_pass_their_node_unit_tests():
    command = [_node(), "--test", "--test-reporter=tap", "tests/js/"]
    res = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    output = res.stdout + res.stderr
    assert res.returncode == 0, output[-8000:]
    passed = re.search(r"^# pass (\d+)$", output, re.M)
    failed = re.search(r"^# fail (\d+)$", output, re.M)
    assert passed and failed, output[-4000:]
    assert int(failed.group(1)) == 0 and int(passed.group(1)) >= 50, output[-4000:]


def test_node_tests_assume_the_number_rules_the_pages_get():
    """The unit tests' default RULES are units.NUMBER_RULES, which every page embeds."""
    script = "console.log(JSON.stringify(require('./tests/js/page_scripts.js').DEFAULT_RULES))"
    res = subprocess.run(
        [_node(), "-e", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout) == NUMBER_RULES
