"""Per-step peaks shared for the dashboards (``memscope.session.step_peaks``) over a real
``torch.distributed`` store: nothing is sent while no rank logs, a step is logged once every
rank has it (or, later, without a rank that fell silent), and a failing store is said once."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from memscope.session.step_peaks import LAG_STEPS, WANTED_KEY, DashboardSink, StepPeakBoard


class Recorded:
    """A sink that keeps what it was asked to log."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[int, int]] = {}

    def __call__(self, step: int, peaks) -> None:
        self.steps[step] = dict(peaks)


def test_no_rank_with_a_writer_means_no_store_traffic():
    store = dist.HashStore()
    board = StepPeakBoard(store, 0, [0, 1])
    for step in range(3):
        board.publish(step, 100 + step)
    board.close()
    assert store.num_keys() == 0 and not store.check([WANTED_KEY])


def test_each_step_is_logged_once_with_every_ranks_peak():
    store = dist.HashStore()
    sink = Recorded()
    writer = StepPeakBoard(store, 1, [0, 1], sink)
    other = StepPeakBoard(store, 0, [0, 1])
    for step in range(3):
        other.publish(step, 1000 + step)
    other.close()
    for step in range(3):
        writer.publish(step, 500 + step)
    writer.close()
    assert sink.steps == {s: {0: 1000 + s, 1: 500 + s} for s in range(3)}


def test_a_silent_rank_does_not_hold_the_others_steps_back():
    store = dist.HashStore()
    sink = Recorded()
    writer = StepPeakBoard(store, 0, [0, 1, 2], sink)
    helper = StepPeakBoard(store, 1, [0, 1, 2])
    steps = LAG_STEPS + 3
    for step in range(steps):
        helper.publish(step, 10)
    helper.close()
    for step in range(steps):
        writer.publish(step, 20)
    writer.close()  # rank 2 never reported: each step is logged with ranks 0 and 1
    assert sorted(sink.steps) == list(range(steps))
    assert all(peaks == {0: 20, 1: 10} for peaks in sink.steps.values())


def test_a_failing_store_is_reported_once_and_publishing_goes_on():
    class GoneStore:
        def set(self, *a):
            raise ConnectionError("store server is gone")

        def check(self, *a):
            raise ConnectionError("store server is gone")

    errors = []
    board = StepPeakBoard(GoneStore(), 0, [0, 1], Recorded(), on_error=errors.append)
    for step in range(5):
        board.publish(step, 1)
    board.close()
    assert len(errors) == 1 and "store server is gone" in str(errors[0])


def test_the_dashboard_sink_writes_the_job_max_and_each_rank_at_the_iteration(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    DashboardSink(tensorboard=writer, iteration_offset=1)(7, {0: 5, 1: 9, 2: 9})
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    got = {}
    for tag in events.Tags()["scalars"]:
        (scalar,) = events.Scalars(tag)
        assert scalar.step == 8  # step 7 is Megatron's iteration 8
        got[tag] = scalar.value
    prefix = "memscope/peak-allocated-bytes/"
    assert got[prefix + "job-max"] == 9 and got[prefix + "job-max-rank"] == 1
    assert [got[f"{prefix}rank{r}"] for r in range(3)] == [5, 9, 9]


def _wandb_run(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    return wandb.init(mode="offline", dir=str(tmp_path), project="memscope")


def test_a_step_logged_after_wandb_moved_on_still_lands_at_its_iteration(tmp_path, monkeypatch):
    from harness.wandb_offline import offline_history

    from memscope.session.step_peaks import ITERATION_KEY

    run = _wandb_run(tmp_path, monkeypatch)
    sink = DashboardSink(wandb=run, iteration_offset=1)
    for iteration in (1, 2, 3):  # Megatron's rows, each logged at its iteration
        run.log({"lm loss": 1.0 / iteration}, iteration)
    sink(0, {0: 100})  # late (iteration 1; W&B is at 3): merged into W&B's current row
    run.log({"lm loss": 0.25}, 4)
    sink(3, {0: 400})  # on time: Megatron's row of iteration 4
    run.log({"lm loss": 0.2}, 5)
    run.finish()
    rows = offline_history(str(tmp_path))
    # Megatron's values all there, and MemScope's, each at its own iteration on its x-axis
    assert [r["_step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["lm loss"] for r in rows] == [1.0, 0.5, 1.0 / 3, 0.25, 0.2]
    landed = {r[ITERATION_KEY]: (r["_step"], r["memscope/peak-allocated-bytes/rank0"])
              for r in rows if ITERATION_KEY in r}  # fmt: skip
    assert landed == {1: (3, 100), 4: (4, 400)}


@pytest.mark.integration
def test_a_megatron_run_lands_its_step_peaks_on_megatrons_iteration_axis(
    tmp_path, monkeypatch, small_cfg
):
    from conftest import load_json, run_in_process
    from harness.wandb_offline import offline_history
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from memscope.session.step_peaks import ITERATION_KEY

    monkeypatch.setenv("WANDB_SILENT", "true")
    board, runs = tmp_path / "tensorboard", tmp_path / "wandb"
    runs.mkdir()
    argv = ["--memscope", "--memscope-outdir", str(tmp_path / "out")]
    # the harness logs the loss per iteration as Megatron's training_log does (step=iteration)
    result = run_in_process(small_cfg, 4, argv, tensorboard_dir=str(board), wandb_dir=str(runs))
    # Megatron's iteration after MemScope's step s is s + 1
    peaks = {row["step"] + 1: row["peak_allocated"]
             for row in load_json(result.report_path)["steps"]}  # fmt: skip
    assert sorted(peaks) == [1, 2, 3, 4]
    tag = "memscope/peak-allocated-bytes/rank0"
    events = EventAccumulator(str(board))
    events.Reload()
    assert {e.step: e.value for e in events.Scalars(tag)} == pytest.approx(peaks, rel=1e-6)
    assert sorted(e.step for e in events.Scalars("lm loss")) == sorted(peaks)  # one x-axis
    rows = offline_history(str(runs))
    assert [r["_step"] for r in rows if "lm loss" in r] == [1, 2, 3, 4]  # none dropped
    landed = {r[ITERATION_KEY]: r[tag] for r in rows if ITERATION_KEY in r}
    assert landed == peaks
