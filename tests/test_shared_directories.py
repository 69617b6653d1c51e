"""Outputs never follow a link the user did not choose (docs/guarantees.md, "Shared
directories"): in a directory others can write (sticky ``/tmp``-like, or group/other
writable), a symlink planted at an output's name, or another user's symlink on the way to it,
is refused, and the file it points to is untouched; in a private directory the user's own
link is followed as before."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from memscope.cli import main
from memscope.io.atomic import atomic_write_json, atomic_write_text
from memscope.io.safe_output import OutputRefused, foreign_link, others_can_write

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_pp2_demo"
NOBODY = 65534


def _sticky(path: Path) -> Path:
    path.mkdir()
    os.chmod(path, 0o1777)  # what /tmp and a team's shared output folder look like
    return path


def _victim(tmp_path: Path) -> Path:
    home = tmp_path / "victim"
    home.mkdir()
    victim = home / "precious.txt"
    victim.write_text("do not overwrite\n")
    return victim


def test_a_link_planted_at_an_outputs_name_in_a_sticky_directory_is_refused(tmp_path):
    shared, victim = _sticky(tmp_path / "shared"), _victim(tmp_path)
    assert others_can_write(str(shared))
    link = shared / "job_summary.json"
    link.symlink_to(victim)
    with pytest.raises(OutputRefused, match="symlink in a directory other users can write"):
        atomic_write_json(str(link), {"x": 1})
    assert victim.read_text() == "do not overwrite\n" and link.is_symlink()


@pytest.mark.parametrize("mode", [0o775, 0o777, 0o1755])
def test_group_or_other_writable_or_sticky_directories_count_as_shared(tmp_path, mode):
    folder = tmp_path / "d"
    folder.mkdir()
    os.chmod(folder, mode)
    assert others_can_write(str(folder))
    os.chmod(folder, 0o755)
    assert not others_can_write(str(folder))


def test_the_users_own_link_in_a_private_directory_is_followed(tmp_path):
    private = tmp_path / "mine"
    private.mkdir()
    os.chmod(private, 0o700)
    target = tmp_path / "target.md"
    target.write_text("old")
    (private / "report.md").symlink_to(target)
    atomic_write_text(str(private / "report.md"), "new")
    assert target.read_text() == "new" and (private / "report.md").is_symlink()


def test_the_cli_refuses_a_planted_page_name_in_one_line(tmp_path, capsys):
    shared, victim = _sticky(tmp_path / "shared"), _victim(tmp_path)
    (shared / "page.html").symlink_to(victim)
    report = EXAMPLE / "rank00000" / "runtime_report.json"
    out = shared / "page.html"
    assert main(["visualize-runtime", "--report", str(report), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refusing to follow it" in err
    assert victim.read_text() == "do not overwrite\n"


def _as_nobody(*argv: str) -> None:
    subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        check=True,
    )


def _second_user_available(tmp_path: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    probe = _sticky(tmp_path / "probe")
    try:
        _as_nobody("ln", "-s", "/nonexistent", str(probe / "link"))
    except (subprocess.CalledProcessError, OSError):
        return False
    return os.lstat(probe / "link").st_uid == NOBODY


@pytest.fixture
def reachable_tmp():
    """A folder the second user can reach (pytest's own are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="memscope-shared-"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_another_users_link_is_refused_final_or_on_the_way(reachable_tmp):
    """A second user (``nobody``, through ``setpriv``) plants links in a sticky directory:
    one at the output's name, one standing for a folder on the way. Both are refused for
    us; a folder link of our own in the same place is followed."""
    tmp_path = reachable_tmp
    if not _second_user_available(tmp_path):
        pytest.skip("needs root and setpriv to act as a second user")
    shared, victim = _sticky(tmp_path / "shared"), _victim(tmp_path)
    os.chmod(victim.parent, 0o777)
    _as_nobody("ln", "-s", str(victim), str(shared / "runtime_report.json"))
    _as_nobody("ln", "-s", str(victim.parent), str(shared / "rank00000"))
    for path in (shared / "runtime_report.json", shared / "rank00000" / "runtime_report.json"):
        assert foreign_link(str(path)) is not None
        with pytest.raises(OutputRefused):
            atomic_write_json(str(path), {"x": 1})
    assert victim.read_text() == "do not overwrite\n"
    assert sorted(os.listdir(victim.parent)) == ["precious.txt"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (shared / "rank00001").symlink_to(mine)  # ours: we chose it
    atomic_write_json(str(shared / "rank00001" / "runtime_report.json"), {"x": 1})
    assert (mine / "runtime_report.json").is_file()
