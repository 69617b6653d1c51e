"""Every rank's per-step peak on the training's own dashboards (TensorBoard, W&B).

Megatron logs memory from one rank (its writers live on the last rank), so a dashboard shows
that rank's peak, not the job's. Here every traced rank puts its last few step peaks under
its own key of the job's ``torch.distributed`` store; the rank that holds the writers reads
every rank's keys and logs, per step: the job's highest peak, which rank had it, and (up to
:data:`MAX_RANK_SERIES` ranks) each rank's own.

Both dashboards get MemScope's values on the training's own x-axis: Megatron's iteration,
which is MemScope's step + ``iteration_offset`` (Megatron-LM's ``train()`` sets
``args.curr_iteration = iteration`` before ``train_step``, MemScope's step, then
``iteration += 1`` and ``training_log(..., iteration)``; megatron/training/training.py).
W&B writes only its current and next row and drops a ``step`` below its current one
("steps must be monotonically increasing"), while this thread logs whenever every rank has
reported, which may be after Megatron logged a later iteration. So each W&B row carries
``memscope/iteration`` and every ``memscope/*`` metric is defined against it
(``define_metric(..., step_metric=...)``): a step is logged with ``step=iteration`` (the row
Megatron logs that iteration in) while W&B is not past it, else merged into W&B's current row
(``commit=False``), still plotted at its own iteration. Two late steps merged into one row keep
the later one's values.

Nothing runs on the training thread but a queue put: the store calls and the logging happen
on a daemon thread, a full queue drops the step (said once), and no rank waits for another.
A step is logged once every rank has reported it (or, past :data:`LAG_STEPS` steps behind
the logging rank's own latest step, with the ranks that have). Until a rank with a writer
has said so in the store, the others send nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memscope.session.job_exchange import default_store

if TYPE_CHECKING:
    from memscope.config import RuntimeConfig
    from memscope.session.teardown import Teardown

logger = logging.getLogger("memscope")

KEY_PREFIX = "memscope/step_peaks"
#: Set by a rank that logs: until it is there, the others send nothing.
WANTED_KEY = f"{KEY_PREFIX}/wanted"
#: Steps each rank keeps in its key (the logging rank may be that far behind).
KEPT_STEPS = 8
#: A step is logged without the ranks that have not reported it this many steps later.
LAG_STEPS = 4
#: Ranks whose own series is logged (beyond, only the job's maximum and its rank).
MAX_RANK_SERIES = 64
_QUEUE = 64
#: At the end, how long the logging rank waits for the others' last steps.
DRAIN_S = 3.0

#: ``sink(step, peaks by rank)``: logs one step.
Sink = Callable[[int, Mapping[int, int]], None]


#: The W&B key holding the iteration each MemScope row belongs to (its ``memscope/*`` x-axis).
ITERATION_KEY = "memscope/iteration"


class DashboardSink:
    """Logs to Megatron's writers: a TensorBoard ``SummaryWriter`` (``add_scalar``) and/or a
    W&B run or the ``wandb`` module (``log``), whichever the training has, at the training's
    iteration: MemScope's step + ``iteration_offset`` (1 for Megatron-LM's loop)."""

    def __init__(
        self, tensorboard: Any = None, wandb: Any = None, iteration_offset: int = 0
    ) -> None:
        self.tensorboard = tensorboard
        self.wandb = wandb
        self.iteration_offset = iteration_offset
        self._axis_defined = False

    def _define_axis(self) -> None:
        """``memscope/*`` plotted against :data:`ITERATION_KEY` (once; a W&B without
        ``define_metric`` plots against its own step)."""
        self._axis_defined = True
        define = getattr(self.wandb, "define_metric", None)
        if define is not None:
            define(ITERATION_KEY)
            define("memscope/*", step_metric=ITERATION_KEY)

    def _wandb_step(self) -> int | None:
        """W&B's current row (the step of its next ``log``); None where it cannot say."""
        run = getattr(self.wandb, "run", None) or self.wandb
        try:
            step = run.step
        except Exception:  # a shared-mode run, an old client, no run
            return None
        return step if isinstance(step, int) else None

    def __call__(self, step: int, peaks: Mapping[int, int]) -> None:
        top = max(peaks, key=lambda r: (peaks[r], -r))
        scalars = {
            "memscope/peak-allocated-bytes/job-max": peaks[top],
            "memscope/peak-allocated-bytes/job-max-rank": top,
            "memscope/peak-allocated-bytes/ranks-reported": len(peaks),
        }
        if len(peaks) <= MAX_RANK_SERIES:
            for rank in sorted(peaks):
                scalars[f"memscope/peak-allocated-bytes/rank{rank}"] = peaks[rank]
        iteration = step + self.iteration_offset
        if self.tensorboard is not None:
            for tag, value in scalars.items():
                self.tensorboard.add_scalar(tag, value, iteration)
        if self.wandb is not None:
            if not self._axis_defined:
                self._define_axis()
            row = {**scalars, ITERATION_KEY: iteration}
            current = self._wandb_step()
            if current is None or iteration >= current:
                self.wandb.log(row, step=iteration)
            else:  # W&B is past this iteration: into its current row, at its own x
                self.wandb.log(row, commit=False)


class StepPeakBoard:
    """One rank's side of the shared per-step peaks (see the module docstring)."""

    def __init__(
        self,
        store: Any,
        rank: int,
        ranks: Sequence[int],
        sink: Sink | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.store = store
        self.rank = rank
        self.ranks = sorted(set(ranks))
        self.sink = sink
        self.on_error = on_error
        self._mine: list[tuple[int, int]] = []
        self._seen: dict[int, dict[int, int]] = {}  # step -> rank -> peak (logging rank)
        self._present: set[int] = set()
        self._logged = -1
        self._dropped = False
        self._failed = False
        self._wanted = False
        self._queue: queue.Queue[tuple[int, int] | None] = queue.Queue(_QUEUE)
        self._thread = threading.Thread(target=self._run, name="memscope-step-peaks", daemon=True)
        self._thread.start()

    def key(self, rank: int) -> str:
        return f"{KEY_PREFIX}/rank{rank}"

    def publish(self, step: int, peak_bytes: int) -> None:
        """This rank's peak of ``step`` (never blocks: a full queue drops it)."""
        try:
            self._queue.put_nowait((step, peak_bytes))
        except queue.Full:
            if not self._dropped:
                self._dropped = True
                logger.warning(
                    "memscope rank %d: step peaks are dropped (store too slow)", self.rank
                )

    def close(self, timeout_s: float = DRAIN_S + 2.0) -> None:
        """Send what is queued, log what can be, and stop the thread (at most ``timeout_s``)."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        if self.sink is not None:
            self._guarded(lambda: self.store.set(WANTED_KEY, "1"))
        while True:
            item = self._queue.get()
            if item is None:
                if not self._failed and self.sink is not None:
                    self._guarded(self._drain)
                return
            if not self._failed:
                self._guarded(lambda item=item: self._send(*item))  # type: ignore[misc]

    def _guarded(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # the store is gone, a writer failed: stop, say it once
            self._failed = True
            if self.on_error is not None:
                self.on_error(exc)

    def _drain(self) -> None:
        """At the end: wait (up to :data:`DRAIN_S`) for the other ranks' last steps, then log
        what there is."""
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            self._read_and_log(final=False)
            if not self._seen:
                return
            time.sleep(0.1)
        self._read_and_log(final=True)

    def _send(self, step: int, peak: int) -> None:
        self._mine = [*self._mine, (step, peak)][-KEPT_STEPS:]
        if not self._wanted:  # nobody logs (no writer anywhere): no store traffic
            self._wanted = self.store.check([WANTED_KEY])
            if not self._wanted:
                return
        self.store.set(self.key(self.rank), ",".join(f"{s}:{p}" for s, p in self._mine))
        if self.sink is not None:
            self._read_and_log(final=False)

    def _read_and_log(self, final: bool) -> None:
        missing = [r for r in self.ranks if r not in self._present]
        for rank in missing:  # once per rank: from then on one multi_get reads them all
            if self.store.check([self.key(rank)]):
                self._present.add(rank)
        present = sorted(self._present)
        if not present:
            return
        values = self.store.multi_get([self.key(r) for r in present])
        for rank, raw in zip(present, values, strict=True):
            for part in bytes(raw).decode().split(","):
                text, _, peak = part.partition(":")
                if text.lstrip("-").isdigit() and peak.isdigit() and int(text) > self._logged:
                    self._seen.setdefault(int(text), {})[rank] = int(peak)
        newest = self._mine[-1][0] if self._mine else -1  # this rank's own progress
        for step in sorted(self._seen):
            peaks = self._seen[step]
            complete = len(peaks) == len(self.ranks)
            if step > self._logged and (complete or final or step <= newest - LAG_STEPS):
                assert self.sink is not None
                self.sink(step, peaks)
                self._logged = step
        for done in [s for s in self._seen if s <= self._logged]:  # logged, or skipped past
            del self._seen[done]


def open_step_peaks(
    config: RuntimeConfig,
    rank: int,
    world_size: int,
    sink: Callable[[], Sink | None] | None,
    teardown: Teardown,
    on_error: Callable[[BaseException], None],
) -> StepPeakBoard | None:
    """This rank's board (closed at teardown) when dashboard peaks are on and the job has a
    store; ``sink`` finds this rank's writers, if any. A failure goes to ``on_error``."""
    if not config.dashboard_peaks:
        return None
    try:
        store = default_store()
        if store is None:
            return None
        ranks = config.traced_ranks(world_size)
        board = StepPeakBoard(store, rank, ranks, sink() if sink else None, on_error=on_error)
    except Exception as exc:
        on_error(exc)
        return None
    teardown.push("step_peaks", board.close)
    return board
