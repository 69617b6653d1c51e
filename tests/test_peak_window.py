"""Per-step peaks from a process-wide peak counter MemScope never resets (``PeakWindow``),
and the setting that resets it instead."""

from __future__ import annotations

import pytest

from memscope.capture.backends.peak_window import PeakWindow
from memscope.config import RuntimeConfig


def test_a_window_that_raises_the_counter_has_the_counter_as_its_exact_peak():
    window = PeakWindow()
    window.start(counter=100, current=40)
    assert window.update(counter=100, current=60) == 60 and not window.exact
    assert window.update(counter=180, current=50) == 180 and window.exact


def test_a_window_below_an_earlier_high_reports_its_largest_reading_as_inexact():
    window = PeakWindow()
    window.start(counter=500, current=40)  # step 1 peaked at 500 earlier
    for current in (70, 120, 90):
        peak = window.update(counter=500, current=current)
    assert peak == 120 and not window.exact
    window.start(counter=500, current=30)  # the next window forgets the last one's readings
    assert window.update(counter=500, current=35) == 35


def test_reset_peak_stats_is_off_by_default_and_warned_without_the_cuda_backend():
    assert RuntimeConfig().reset_peak_stats is False
    with pytest.warns(
        UserWarning, match="--memscope-reset-peak-stats has no effect with the storage"
    ):
        notes = RuntimeConfig(reset_peak_stats=True).warn_ignored(False, "storage")
    assert len(notes) == 1
