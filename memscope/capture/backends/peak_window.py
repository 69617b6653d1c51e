"""Per-step high-water marks from a process-wide peak counter that is never reset.

``torch.cuda.reset_peak_memory_stats`` resets a counter the whole process shares: Megatron's
own ``report_memory`` ("max allocated") and ``--log-memory-to-tensorboard`` read it too, so
resetting it at every step would silently turn their figures into per-step values.
:class:`PeakWindow` leaves the counter alone and derives the peak of a window (a step) from
it: when the counter rose during the window, the window set a new high-water mark and the
counter *is* its exact peak; otherwise the window's peak is no higher than the counter and
the largest reading seen in it is the best known value (a lower bound, flagged inexact).
The step that matters for an OOM or for the run's peak is always one that raised the
counter, so its figure is exact.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PeakWindow:
    """High-water mark of one window over a monotonic process-wide peak counter."""

    counter_at_start: int = 0
    seen: int = 0  # the largest current value read in the window
    exact: bool = False  # whether :attr:`peak` is the true peak of the window

    def start(self, counter: int, current: int) -> None:
        """Open a window at a reading (peak counter, current value)."""
        self.counter_at_start, self.seen, self.exact = counter, current, False

    def update(self, counter: int, current: int) -> int:
        """Fold one reading in; return the window's peak so far."""
        self.seen = max(self.seen, current)
        if counter > self.counter_at_start:  # a new process-wide high inside this window
            self.exact = True
            return counter
        return self.seen
