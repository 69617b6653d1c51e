"""Where golden values were measured (tools/golden_history.py): the published benchmark's
--extract traces each case's golden values to the commit that wrote them (renames followed),
whose configuration, megatron-core release and name it then uses; the FlagScale-tree
benchmark finds each shipped golden file's first commit by its blob id. And a value is passed
on as the functional tests' shell script passes it. Run on a small real git history built
here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_static_gpu_golden as golden  # noqa: E402
import bench_static_published as bench  # noqa: E402


def _git(repo: str, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")  # fmt: skip
    out = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, env=env,
                         check=True)  # fmt: skip
    return out.stdout.strip()


def _new_repo(path) -> str:
    repo = str(path)
    os.makedirs(repo)
    _git(repo, "init", "-q")
    return repo


def _commit(repo: str, files: dict[str, str | None], message: str) -> str:
    for path, text in files.items():
        full = os.path.join(repo, path)
        if text is None:
            _git(repo, "rm", "-q", path)
            continue
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
        _git(repo, "add", path)
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture()
def history(tmp_path, monkeypatch):
    repo = _new_repo(tmp_path / "megatron")
    old = "tests/functional_tests/test_cases/gpt/gpt3_mr_case_dgx_a100_1N8G"
    new = "tests/functional_tests/test_cases/gpt/gpt3_case"
    golden_text = '{"mem-max-allocated-bytes": {"values": {"1": 10}}}\n'
    first = _commit(repo, {f"{old}/golden_values_dev.json": golden_text}, "measured")
    files = {f"{old}/golden_values_dev.json": golden_text.replace("10", "12"),
             f"{old}/model_config.yaml": "MODEL_ARGS: {}\n"}  # fmt: skip
    remeasured = _commit(repo, files, "re-measured")
    # a pure rename (R100) and a later move of the config measure nothing
    _git(repo, "mv", old, new)
    _git(repo, "commit", "-q", "-m", "renamed")
    head = _commit(repo, {f"{new}/model_config.yaml": "MODEL_ARGS: {--bf16: true}\n"}, "flag")
    # an edit of another field (Megatron-LM 93ebf8d72f dropped leading NaN iteration times)
    edited = '{"mem-max-allocated-bytes": {"values": {"1": 12}}, "iteration-time": {}}\n'
    head = _commit(repo, {f"{new}/golden_values_dev.json": edited}, "edit")
    monkeypatch.setattr(bench, "SOURCE_COMMIT", head)
    return os.path.join(repo, ".git"), first, remeasured, old, new


def test_golden_values_are_traced_to_the_commit_that_wrote_them(history):
    git_dir, first, remeasured, old, new = history
    commit, _, path, names = bench.measured_at(git_dir, f"{new}/golden_values_dev.json")
    assert commit == remeasured != first  # not the rename after it, nor the edit
    assert path == f"{old}/golden_values_dev.json"  # where it was then
    assert names == [f"{old}/golden_values_dev.json", f"{new}/golden_values_dev.json"]


def test_arguments_at_reads_literal_defaults_and_the_bucket_layout_flag(tmp_path, monkeypatch):
    repo = _new_repo(tmp_path / "m")
    text = (
        "group.add_argument('--muon-tp-mode', type=str, default='blockwise',\n"
        "    help='x')\n"
        "group.add_argument('--min-offloaded-tensor-size', type=int, default=1024 * 1024)\n"
        "group.add_argument('--megatron-fsdp-main-grads-dtype', default=DEFAULT_DTYPE)\n"
    )
    commit = _commit(repo, {"megatron/training/arguments.py": text}, "args")
    got = bench.arguments_at(os.path.join(repo, ".git"), commit)
    assert got == {
        "defaults": {"muon_tp_mode": "blockwise", "min_offloaded_tensor_size": 1024 * 1024},
        "layer_wise_param_layout": False,  # a name is no literal: the source default stays
    }


def test_world_size_comes_from_the_name_the_case_had_when_measured():
    then = "gpt3_mr_case_dgx_a100_1N8G"
    assert bench._world_size("gpt3_case", then, [], {}, {}) == (
        8,
        "name 1N8G (when measured: gpt3_mr_case_dgx_a100_1N8G)",
    )
    recipes_then = {"gpt3_case": (16, "tests/test_utils/recipes/gpt.yaml@abc nodes x gpus")}
    world, source = bench._world_size("gpt3_case", "gpt3_case", [], recipes_then, {})
    assert world == 16 and source.endswith("(when measured: gpt3_case)")
    # only a path it had on the way says it: used, and said so
    world, source = bench._world_size("gpt3_case", "gpt3_case", ["x/gpt3_old_2N8G/g.json"], {}, {})
    assert world == 16 and "a name on the way" in source
    assert bench._world_size("gpt3_case", "gpt3_case", [], {}, {})[0] is None


def test_a_quoted_or_escaped_value_reaches_megatron_as_the_script_passes_it():
    # _run_training.sh: `echo "$value" | xargs` then eval "TRAINING_PARAMS_ARRAY=(...)"
    layout = "Et*3\\\\|\\\\(tt\\\\|\\\\)*6tL"  # as YAML gives it: two backslashes each
    argv = golden.argv_from_model_args({"--pipeline-model-parallel-layout": layout})
    assert argv == ["--pipeline-model-parallel-layout", "Et*3|(tt|)*6tL"]
    plain = golden.argv_from_model_args({"--pipeline-model-parallel-layout": "Et*3|(tt|)*6tmL"})
    assert plain[1] == "Et*3|(tt|)*6tmL"


def test_blob_id_is_gits(tmp_path):
    import golden_history

    path = tmp_path / "golden_values_dev_dgx_h100.json"
    path.write_bytes(b'{"mem-allocated-bytes": {"values": {"1": 5}}}\n')
    printed = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True,
                             check=True).stdout.strip()  # fmt: skip
    assert golden_history.blob_id(path.read_bytes()) == printed


def test_first_written_is_the_earliest_commit_with_those_bytes(history):
    import golden_history

    git_dir, _, remeasured, old, _ = history
    written = golden_history.first_written(git_dir, "HEAD")
    text = '{"mem-max-allocated-bytes": {"values": {"1": 12}}}\n'
    _, commit, path = written[golden_history.blob_id(text.encode())]
    assert commit == remeasured and path == f"{old}/golden_values_dev.json"  # not the rename


def test_a_tree_golden_file_takes_its_recorded_release_only_with_the_recorded_bytes(
    tmp_path, monkeypatch
):
    import json

    import golden_history

    path = tmp_path / "golden_values_dev_dgx_a100.json"
    path.write_bytes(b"{}\n")
    record = {"blob": golden_history.blob_id(b"{}\n"), "commit": "c" * 40, "date": "2025-04-04",
              "path": "p", "megatron_core_version": "0.12.0"}  # fmt: skip
    table = tmp_path / "measured_at.json"
    table.write_text(json.dumps({"files": {"moe/case/golden_values_dev_dgx_a100.json": record}}))
    monkeypatch.setattr(golden, "MEASURED_AT", str(table))
    assert golden.measured_at("moe", "case", str(path)) == record
    path.write_bytes(b"{ }\n")  # another measurement: not the recorded one
    assert golden.measured_at("moe", "case", str(path)) is None
    assert golden.measured_at("gpt", "case", str(path)) is None


def test_a_copied_golden_file_carries_the_run_that_wrote_its_bytes(tmp_path, monkeypatch):
    # another case's numbers copied byte for byte (Megatron-LM's gb200 release case took the
    # h100 one's): the run is the original's, at its path, whatever git's copy detection
    # or --follow would pair
    repo = _new_repo(tmp_path / "m")
    root = "tests/functional_tests/test_cases/gpt"
    text = '{"mem-max-allocated-bytes": {"values": {"1": 7}}}\n'
    first = _commit(repo, {f"{root}/h100_case/golden_values_dev.json": text}, "measured")
    _commit(repo, {f"{root}/other/golden_values_dev.json": text.replace("7", "8")}, "other")
    head = _commit(repo, {f"{root}/gb200_case/golden_values_dev.json": text}, "copied")
    monkeypatch.setattr(bench, "SOURCE_COMMIT", head)
    commit, _, path, names = bench.measured_at(
        os.path.join(repo, ".git"), f"{root}/gb200_case/golden_values_dev.json"
    )
    assert (commit, path) == (first, f"{root}/h100_case/golden_values_dev.json")
    assert names == [path]


def _dated_commit(repo: str, files: dict[str, str], date: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t", GIT_AUTHOR_DATE=date,
               GIT_COMMITTER_DATE=date)  # fmt: skip
    for path, text in files.items():
        full = os.path.join(repo, path)
        os.makedirs(os.path.dirname(full) or repo, exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
        subprocess.run(["git", "-C", repo, "add", path], check=True, env=env)
    subprocess.run(["git", "-C", repo, "commit", "-q", "-m", date], check=True, env=env)
    return _git(repo, "rev-parse", "HEAD")


def test_the_transformer_engine_a_commit_builds_is_read_from_its_lock_pin_range_or_date(tmp_path):
    """``golden_history.transformer_engine_version`` on a small real pair of histories."""
    import golden_history

    te = _new_repo(tmp_path / "te")
    _git(te, "checkout", "-q", "-b", "main")
    old = _dated_commit(te, {"build_tools/VERSION.txt": "2.1.0\n"}, "2025-03-01T00:00:00")
    _git(te, "tag", "v2.1", old)
    dev = _dated_commit(te, {"build_tools/VERSION.txt": "2.2.0.dev0\n"}, "2025-03-20T00:00:00")
    pinned = _dated_commit(te, {"build_tools/VERSION.txt": "2.5.0\n"}, "2025-06-01T00:00:00")
    mg = _new_repo(tmp_path / "megatron")
    te_git, mg_git = os.path.join(te, ".git"), os.path.join(mg, ".git")

    def read(files: dict[str, str], date: str = "2025-07-01T00:00:00") -> tuple[str, str]:
        commit = _dated_commit(mg, files, date)
        return golden_history.transformer_engine_version(mg_git, te_git, commit)

    assert read({"Dockerfile.ci.dev": f"FROM x\nARG TE_COMMIT={dev}\n"}) == (
        "2.2.0.dev0", f"Dockerfile.ci.dev TE_COMMIT {dev[:12]}")  # fmt: skip
    pyproject = f'[tool.uv.sources]\ntransformer-engine = {{ git = "u", rev = "{pinned}" }}\n'
    assert read({"pyproject.toml": pyproject}) == ("2.5.0", f"pyproject.toml rev {pinned[:12]}")
    # a branch pin is what uv.lock resolved
    lock = 'name = "transformer-engine"\nversion = "2.11.0+c188b533"\nsource = { git = "u" }\n'
    branch = '[tool.uv.sources]\ntransformer-engine = { git = "u", rev = "release_v2.11" }\n'
    assert read({"pyproject.toml": branch, "uv.lock": lock}) == ("2.11.0+c188b533", "uv.lock")
    ranged = 'dependencies = [\n    "transformer-engine[pytorch]>=2.9.0a0,<2.12.0",\n]\n'
    no_pin = {"pyproject.toml": ranged, "uv.lock": "# empty\n", "Dockerfile.ci.dev": "FROM x\n"}
    assert read(no_pin) == ("2.9.0a0", "pyproject.toml range: its lower bound")
    # no pin: the base image's TE, no newer than the newest release tagged by then
    unpinned = _new_repo(tmp_path / "megatron-old")
    commit = _dated_commit(unpinned, {"README": "x\n"}, "2025-04-01T00:00:00")
    version, source = golden_history.transformer_engine_version(
        os.path.join(unpinned, ".git"), te_git, commit
    )
    assert version == "2.1"
    assert source == "no pin: the newest Transformer Engine release by 2025-04-01"
