"""Figures the docs quote from the committed benchmark outputs are those outputs' (which
their own tests check against the code): the FP8 ``tp_comm_overlap`` golden case in
docs/static-estimator.md and hwang2006's first TP 4 run in docs/analyze-log.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _text(*parts: str) -> str:
    return " ".join(ROOT.joinpath(*parts).read_text(encoding="utf-8").split())


def test_the_fp8_tp_overlap_golden_figure_is_the_benchmarks():
    table = ROOT.joinpath("benchmarks", "static_gpu_golden.txt").read_text(encoding="utf-8")
    (error,) = re.findall(r"^gpt/\S+_tp2_pp2_current_scaling_\S*tp_overlap\s.*?([-+]\d+\.\d%)",
                          table, re.M)  # fmt: skip
    assert f"`..._tp2_pp2_current_scaling_...`) is {error}:" in _text("docs", "static-estimator.md")


def _fixture_rows(log: str) -> dict[tuple[int, int], str]:
    """(run, rank) -> the error column of ``log``'s rows in the analyze-log fixture table."""
    table = ROOT.joinpath("benchmarks", "analyze_log_fixtures.txt").read_text(encoding="utf-8")
    row = r"^\| " + re.escape(log) + r" \| (\d+) \| (\d+) \|[^|]*\|[^|]*\|[^|]*\| ([-+]\d+\.\d%) \|"
    return {(int(run), int(rank)): e for run, rank, e in re.findall(row, table, re.M)}


def test_the_first_tp4_run_figure_is_the_fixture_tables():
    run = _fixture_rows("gpt2_345m_tp4_fp16_two_runs.log")
    (error,) = {e for (number, _), e in run.items() if number == 1}  # every rank alike
    assert f"is unchanged by that term ({error};" in _text("docs", "analyze-log.md")


def test_the_analyze_log_docs_figures_are_the_fixture_tables():
    docs = _text("docs", "analyze-log.md")
    rocm = _fixture_rows("gpt_56l_6144h_tp4_pp2_sp_rocm_after1.log")
    first = {rocm[(1, r)] for r in range(4)}
    last = {rocm[(1, r)] for r in range(4, 8)}
    assert len(first) == len(last) == 1  # each stage's ranks alike
    assert f"shows {first.pop()} / {last.pop()}" in docs
    # liguodongiot's DP 4, TP 2 x PP 2, TP 4 and PP 4 runs and hwang2006's second TP 4 run
    five = _fixture_rows("gpt2_345m_fp16_five_runs_pp4_tp2pp2.log")
    ranks = [e for (run, _), e in five.items() if run >= 2]
    ranks += [e for (run, _), e in _fixture_rows("gpt2_345m_tp4_fp16_two_runs.log").items()
              if run == 2]  # fmt: skip
    worst = max(abs(float(e[:-1])) for e in ranks)
    assert f"every one of their {len(ranks)} ranks is within {worst:.1f}%" in docs
    assert f"PP 4's last stage {five[(5, 3)]}, TP 2 x PP 2's {five[(3, 3)]}" in docs
    (oom,) = _fixture_rows("gpt2_774m_fp16_oom_v100.log").values()
    assert oom.startswith("-")  # the estimate below what the log measured
    assert f"the estimate of that moment is {oom[1:]} below its allocated + request" in docs
    (qwen,) = _fixture_rows("qwen2_0.5b_bf16_dp2.log").values()
    assert f"from -5.3% to {qwen}" in docs and f"The Qwen2 gap ({qwen}, within the band)" in docs


def test_the_rocm_runs_adam_temporary_is_one_fp32_copy_of_each_stages_parameters():
    from memscope.analysis.static.estimator import estimate_rank, position_of_rank
    from memscope.inputs.log_spec import run_spec
    from memscope.inputs.training_log import read_runs

    log = ROOT / "tests" / "data" / "logs" / "gpt_56l_6144h_tp4_pp2_sp_rocm_after1.log"
    spec = run_spec(read_runs([str(log)])[0]).spec
    counts = {estimate_rank(spec, position_of_rank(spec, r)).persistent.param_count for r in (0, 4)}
    copies = {round(n * 4 / 2**20) for n in counts}
    (mib,) = copies  # the same on both stages
    assert f"on both stages ({mib:,} MiB)" in _text("docs", "analyze-log.md")


def test_the_planner_docs_name_plan_1s_layout_as_the_benchmark_prints_it():
    docs = ROOT.joinpath("docs", "planner.md").read_text(encoding="utf-8")
    text = ROOT.joinpath("benchmarks", "plan_recipes.txt").read_text(encoding="utf-8")
    flags = {"TP": "tensor-model-parallel-size", "PP": "pipeline-model-parallel-size",
             "CP": "context-parallel-size", "EP": "expert-model-parallel-size"}  # fmt: skip
    named = 0
    for row in (line for line in docs.splitlines() if line.startswith("| ") and "%" in line):
        recipe = row[2:].split(" (", 1)[0]
        layout = re.search(r"% \(((?:(?:TP|PP|CP|EP) \d+(?:, )?)+):", row)
        if not layout:
            continue  # the row names the recipe's own layout, not plan 1's
        block = text.split(f"{recipe} on ", 1)[1].split("\n")[2]
        for size in layout.group(1).split(", "):
            kind, n = size.split()
            assert f"--{flags[kind]} {n} " in block + " ", (recipe, size)
        named += 1
    assert named == 4  # Llama-3 8B, Llama-3 70B, Mixtral, DeepSeek-V3
