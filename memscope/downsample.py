"""Bounded series: which samples to keep so a plot stays small without losing the peak.

Used by the analyses that record series (the active-memory timeline) and by the HTML
payloads; any room may import it.
"""

from __future__ import annotations

from collections.abc import Sequence


def downsample_indices(values: Sequence[float], max_points: int) -> list[int]:
    """Indices to keep: min and max of each bucket, the first, the last and the global max."""
    n = len(values)
    if n <= max_points:
        return list(range(n))
    keep = {0, n - 1, max(range(n), key=values.__getitem__)}
    buckets = max(1, max_points // 2)
    size = n / buckets
    for b in range(buckets):
        lo, hi = int(b * size), min(n, int((b + 1) * size))
        if lo >= hi:
            continue
        chunk = range(lo, hi)
        keep.add(min(chunk, key=values.__getitem__))
        keep.add(max(chunk, key=values.__getitem__))
    return sorted(keep)
