"""The analyze-log page of a multi-run log in a real headless Chromium: choosing a run in the
page's run selector shows that run's ranks and figures and hides the others.

Chromium's ``--dump-dom`` cannot click, so the page under test is the command's own page with
one script appended after the page's script: it does what a user does (set the ``<select>``'s
value, fire its ``change`` event) and the page's own handler reacts. Every assertion reads the
DOM Chromium built.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from memscope.cli import main

pytestmark = pytest.mark.integration  # a real browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FIVE_RUNS_LOG = Path(__file__).parent / "data" / "logs" / "gpt2_345m_fp16_five_runs_pp4_tp2pp2.log"
RUN_DIV = re.compile(r'<div class="log-run" id="run-(\d+)"( hidden(?:="")?)?>')


def _page(tmp_path: Path, capsys) -> tuple[Path, dict]:
    rc = main(["analyze-log", str(FIVE_RUNS_LOG), "--outdir", str(tmp_path / "out")])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((tmp_path / "out" / "log_report.json").read_text())
    return tmp_path / "out" / "log_report.html", doc


def _choose(page: Path, choices: list[int], name: str) -> Path:
    """The page with a user's choices of run (indexes into the selector), in order, made after
    the page's own script ran."""
    steps = "".join(f'sel.value = "{i}"; sel.dispatchEvent(new Event("change"));' for i in choices)
    script = (
        f'<script>(() => {{ const sel = document.getElementById("run"); {steps} }})();</script>'
    )
    html = page.read_text(encoding="utf-8")
    assert html.count("</body>") == 1
    out = page.with_name(name)
    out.write_text(html.replace("</body>", script + "</body>"), encoding="utf-8")
    return out


def _dom(tmp_path: Path, page: Path) -> str:
    res = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--enable-logging=stderr", "--v=0",
         f"--user-data-dir={tmp_path / ('profile-' + page.stem)}",
         "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    # neither the page's script nor the choice raised (Chromium logs "Uncaught ...")
    assert [ln for ln in res.stderr.splitlines() if ":CONSOLE" in ln and "Uncaught" in ln] == []
    return res.stdout


def _runs(dom: str) -> dict[int, tuple[bool, str]]:
    """Per run index: (hidden, its part of the DOM)."""
    found = list(RUN_DIV.finditer(dom))
    assert found, "no run on the page"
    out = {}
    for k, m in enumerate(found):
        end = found[k + 1].start() if k + 1 < len(found) else len(dom)
        out[int(m.group(1))] = (m.group(2) is not None, dom[m.start() : end])
    return out


def _ranks_table(part: str, index: int) -> list[list[str]]:
    """The rows (cells as text) of run ``index``'s ranks section."""
    section = part[part.index(f'id="run{index}-section-ranks"') :]
    section = section[: section.index("</section>")]
    rows = re.findall(r"<tr>(.*?)</tr>", section, re.S)
    return [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
            for r in rows if "<td" in r]  # fmt: skip


def _bars(part: str, index: int) -> int:
    """Bars plotly drew in run ``index``'s stage chart (0: not drawn)."""
    chart = part[part.index(f'id="run{index}-stages-chart"') :]
    chart = chart[: chart.index("</section>")]
    return chart.count('class="point"')


def _gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB"


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (.ci/run installs it)")
def test_choosing_a_run_shows_its_ranks_and_figures_and_hides_the_others(tmp_path, capsys):
    page, doc = _page(tmp_path, capsys)
    runs = doc["runs"]
    assert len(runs) == 5
    pp4, tp2pp2 = runs[4], runs[2]

    # as opened: run 1 (one GPU, no memory line) is shown, the others are hidden
    shown = _runs(_dom(tmp_path, page))
    assert [i for i, (hidden, _) in shown.items() if not hidden] == [0]
    first = shown[0][1]
    assert "no memory line and no out-of-memory message in this run" in first
    assert _ranks_table(first, 0) == []

    # the user picks run 5 (PP 4): its four stages' ranks, as measured, and its chart
    shown = _runs(_dom(tmp_path, _choose(page, [4], "pp4.html")))
    assert [i for i, (hidden, _) in shown.items() if not hidden] == [4]
    part = shown[4][1]
    rows = _ranks_table(part, 4)
    expected = [
        (str(row["rank"]), f"tp0 cp0 ep0 dp0 pp{row['grid']['pp']}") for row in pp4["ranks"]
    ]
    assert [(r[0], r[1]) for r in rows] == expected
    assert [r[1][-3:] for r in rows] == ["pp0", "pp1", "pp2", "pp3"]
    assert [r[6] for r in rows] == [_gib(row["measured"]["max_allocated"]) for row in pp4["ranks"]]
    assert rows[0][6] == "7.46 GiB"  # rank 0's 7643.34 MB as printed
    assert _bars(part, 4) == 2 * 4  # measured and predicted for each of the four stages
    assert _bars(shown[0][1], 0) == 0  # the run left is hidden, not redrawn

    # then run 3 (TP 2 x PP 2): two stages, two ranks each; run 5 is hidden again, its chart
    # kept (drawn once, when first shown)
    shown = _runs(_dom(tmp_path, _choose(page, [4, 2], "pp4-then-tp2pp2.html")))
    assert [i for i, (hidden, _) in shown.items() if not hidden] == [2]
    part = shown[2][1]
    rows = _ranks_table(part, 2)
    grids = [r[1] for r in rows]
    places = [(row["grid"]["tp"], row["grid"]["pp"]) for row in tp2pp2["ranks"]]
    assert sorted(grids) == sorted(f"tp{tp} cp0 ep0 dp0 pp{pp}" for tp, pp in places)
    assert {g[-3:] for g in grids} == {"pp0", "pp1"} and {g[:3] for g in grids} == {"tp0", "tp1"}
    by_rank = {r[0]: r[6] for r in rows}
    assert by_rank["0"] == "7.08 GiB" and by_rank["3"] == "5.25 GiB"  # 7253.23 / 5373.50 MB
    assert _bars(part, 2) == 2 * 2
    assert shown[4][0] and _bars(shown[4][1], 4) == 2 * 4
