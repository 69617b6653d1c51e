"""Per-step peaks shared for the dashboards (``memscope.session.step_peaks``) over a real
``torch.distributed`` store: nothing is sent while no rank logs, a step is logged once every
rank has it (or, later, without a rank that fell silent), and a failing store is said once."""

from __future__ import annotations

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


def test_the_dashboard_sink_writes_the_job_max_and_each_rank():
    class Board:  # the one method a TensorBoard SummaryWriter is asked for
        def __init__(self):
            self.scalars = []

        def add_scalar(self, tag, value, step):
            self.scalars.append((tag, value, step))

    tb = Board()
    DashboardSink(tensorboard=tb)(7, {0: 5, 1: 9, 2: 9})
    got = {tag: value for tag, value, step in tb.scalars if step == 7}
    prefix = "memscope/peak-allocated-bytes/"
    assert got[prefix + "job-max"] == 9 and got[prefix + "job-max-rank"] == 1
    assert [got[f"{prefix}rank{r}"] for r in range(3)] == [5, 9, 9]
