"""The offline paths never import torch: reading reports, rendering pages, ``--help``, the
static estimate. Checked in a fresh interpreter where ``import torch`` fails (this test
process has already imported torch, so the process boundary is the thing tested)."""

from __future__ import annotations

import json
import os
import pkgutil
import shutil
import subprocess
import sys
import textwrap

import memscope

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.dirname(os.path.abspath(memscope.__file__))
EXAMPLE = os.path.join(REPO, "examples", "cpu_pp2_demo")
EXAMPLE_REPORT = os.path.join(EXAMPLE, "rank00000", "runtime_report.json")
STATIC_CONFIG = os.path.join(REPO, "configs", "static", "tiny_gpt.json")
ANALYZE_LOG = os.path.join(REPO, "tests", "data", "logs", "gpt2_774m_fp16_oom_v100.log")


def _modules(subpackage: str) -> list[str]:
    """``memscope.<subpackage>`` and every module directly under it."""
    path = os.path.join(PACKAGE, *subpackage.split("."))
    names = [f"memscope.{subpackage}"]
    names += [
        f"memscope.{subpackage}.{m.name}"
        for m in pkgutil.iter_modules([path])
        if not m.name.startswith("__")  # cli/__main__ runs the CLI on import
    ]
    return names


OFFLINE_MODULES = [
    *_modules("events"),
    *_modules("io"),
    *_modules("reporters"),
    *_modules("report"),
    "memscope.units",
    "memscope.analysis.job",
    *_modules("analysis"),
    *_modules("analysis.static"),
    *_modules("inputs"),
    *_modules("cli"),
]

# Runs in the child: torch (and everything under it) made unimportable before anything else.
CHILD = textwrap.dedent(
    """
    import contextlib, importlib, io, json, sys
    sys.modules["torch"] = None  # any "import torch" now raises ImportError

    modules, calls = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    failures = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            failures.append(f"import {name}: {exc}")
    import memscope
    from memscope.cli import main

    memscope_file = memscope.__file__

    for argv in calls:
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(argv)
        except SystemExit as exc:  # --help
            rc = exc.code
        except ImportError as exc:
            rc = f"ImportError: {exc}"
        if rc not in (0, None):
            failures.append(f"memscope {' '.join(argv)}: {rc}: {err.getvalue()[-500:]}")
    loaded = sorted(
        name for name, module in sys.modules.items()
        if module is not None and (name == "torch" or name.startswith("torch."))
    )
    print(json.dumps({"failures": failures, "torch_modules": loaded, "memscope": memscope_file}))
    """
)


def _real_trace(outdir) -> str:
    """A real trace.jsonl, written here (where torch is available) by a traced torch loop."""
    import torch

    from memscope.integrations.torch import MemScopeTorchRuntime

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemScopeTorchRuntime(model, opt, outdir=str(outdir), backend="storage") as ms:
        for step in range(2):
            with ms.step(step):
                model(torch.randn(4, 8)).sum().backward()
                with ms.optimizer_step():
                    opt.step()
    return os.path.join(ms.report_dir, "trace.jsonl")


def test_offline_modules_and_commands_run_without_torch(tmp_path):
    trace = _real_trace(tmp_path / "traced")
    job = tmp_path / "job"  # a copy: the job page's command writes rank pages beside reports
    shutil.copytree(EXAMPLE, job)
    calls = [
        ["--help"],
        *[
            [c, "--help"]
            for c in (
                "summarize",
                "visualize-runtime",
                "analyze-static",
                "analyze",
                "export",
                "diff",
                "analyze-snapshot",
                "analyze-log",
            )
        ],
        ["demo", "--help"],
        ["summarize", "--report", EXAMPLE_REPORT],
        ["visualize-runtime", "--report", EXAMPLE_REPORT, "--out", str(tmp_path / "rank.html")],
        ["visualize-runtime", "--report", str(job), "--out", str(tmp_path / "job.html")],
        ["analyze-static", "--config", STATIC_CONFIG, "--outdir", str(tmp_path / "static")],
        ["analyze", "--trace", trace, "--out", str(tmp_path / "replayed.json")],
        ["diff", EXAMPLE, EXAMPLE, "--out", str(tmp_path / "diff")],
        ["analyze-log", ANALYZE_LOG, "--outdir", str(tmp_path / "log")],
    ]
    path = [os.path.dirname(PACKAGE), os.environ.get("PYTHONPATH", "")]  # this memscope
    res = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(OFFLINE_MODULES), json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert result["failures"] == [], "\n".join(result["failures"])
    assert result["torch_modules"] == []
    assert result["memscope"] == memscope.__file__  # the child tested this checkout
    for page in ("rank.html", "job.html"):
        assert (tmp_path / page).stat().st_size > 100_000
    assert (tmp_path / "static" / "static_report.json").exists()
    assert (tmp_path / "log" / "log_report.html").exists()
    replayed = json.loads((tmp_path / "replayed.json").read_text())
    assert [s["step"] for s in replayed["steps"]] == [0, 1]
