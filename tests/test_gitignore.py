"""What the commands write by default, run from a checkout, never shows up in ``git status``."""

from __future__ import annotations

import argparse
import os
import subprocess

from memscope.cli import build_parser

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _default_output_folders() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    folders = set()
    for command in sub.choices.values():
        for action in command._actions:
            if action.dest in ("out", "outdir") and isinstance(action.default, str):
                folders.add(action.default)
    return folders


def test_every_commands_default_output_folder_is_ignored_by_git():
    folders = _default_output_folders()
    assert {"outputs", "memscope_diff", "memscope_demo"} <= folders
    for folder in sorted(folders):
        probe = os.path.join(folder, "rank00000", "runtime_report.json")
        res = subprocess.run(
            ["git", "check-ignore", "-q", probe], cwd=REPO, capture_output=True, check=False
        )
        assert res.returncode == 0, f"{folder}/ is not in .gitignore"
