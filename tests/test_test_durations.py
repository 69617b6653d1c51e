"""tools/test_durations.py: it times tests in wall and CPU seconds and names a unit test over
the limit (an integration test may take longer)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

TOOL = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "test_durations.py"
)

_TOY = """
import time
import pytest

def test_fast():
    assert True

def test_slow_unit():
    time.sleep(0.6)

@pytest.mark.integration
def test_slow_integration():
    time.sleep(0.6)
"""


def _tool(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_toy.py").write_text(_TOY)
    (tmp_path / "conftest.py").write_text(
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'integration: slow')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, TOOL, *args, "--", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
         "--basetemp", str(tmp_path / "base"), "test_toy.py"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip


def test_a_unit_test_over_the_limit_is_named_and_fails_the_run(tmp_path):
    res = _tool(tmp_path, "--top", "2", "--limit", "0.5")
    assert res.returncode == 1, res.stdout + res.stderr
    assert re.search(r"^3 tests \(pytest .*\): [\d.]+ s wall, [\d.]+ s CPU$", res.stdout, re.M)
    rows = re.findall(r"^ +([\d.]+) +([\d.]+)  (unit|integration) +(\S+)$", res.stdout, re.M)
    assert {row[3] for row in rows} == {
        "test_toy.py::test_slow_unit",
        "test_toy.py::test_slow_integration",
    }
    for wall, cpu, layer, nodeid in rows:
        assert float(wall) >= 0.6 and float(cpu) < 0.5  # sleeping takes no CPU
        assert (layer == "integration") == nodeid.endswith("integration")
    over = [line for line in res.stdout.splitlines() if line.startswith("over ")]
    assert over == ["over 0.5 s outside the integration layer: test_toy.py::test_slow_unit"]


def test_within_the_limit_it_exits_with_pytests_status(tmp_path):
    res = _tool(tmp_path, "--limit", "5")
    assert res.returncode == 0 and "3 passed" in res.stdout, res.stdout + res.stderr
    assert "over " not in res.stdout
