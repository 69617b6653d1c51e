"""A launcher's hostfile -> the job's world size."""

from __future__ import annotations

from memscope.analysis.static.validation import show
from memscope.inputs.config_text import read_config_text
from memscope.inputs.values import as_int


def read_hostfile(path: str) -> int:
    """The world size of a hostfile: the sum of its ``host slots=N`` lines (FlagScale's
    runner starts ``slots`` processes per host; ``#`` comments and blank lines skipped)."""
    total = 0
    for number, line in enumerate(read_config_text(path).splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        slots = [f for f in line.split()[1:] if f.startswith("slots=")]
        if not slots:
            raise ValueError(f"{path}: line {number}: expected 'host slots=N', got {show(line)}")
        total += as_int(slots[0][len("slots=") :], f"{path}: line {number}: slots", minimum=1)
    if total == 0:
        raise ValueError(f"{path}: no 'host slots=N' line")
    return total
