"""What one line of a Megatron-LM / FlagScale training log says, launcher prefixes removed.

Each pattern follows the code that prints the line (sources in docs/analyze-log.md):

* launcher prefixes: torchrun's ``[default0]:`` (``--tee``/``--redirects``, local rank) or a
  ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` such as ``[rank3]:``; ``srun --label``'s ``3: ``
  (global task id); ``[host:rank]:`` wrappers; pdsh's ``host: ``; timestamps;
* ``report_memory`` (megatron/training/utils.py): ``[Rank N] (after K iterations) memory (MB)
  | allocated: X | max allocated: X | reserved: X | max reserved: X`` (Megatron-LM of 2019-20,
  on torch < 1.4: ``cached`` / ``max cached`` for reserved); Megatron-Bridge's ``report_memory``
  (src/megatron/bridge/training/utils/train_utils.py): ``... memory (GB) | mem-allocated-gigabytes:
  X | ...``, ``torch.cuda.memory_stats()`` in GB of 10**9 bytes;
* ``report_theoretical_memory`` (megatron/training/theoretical_memory_usage.py);
* ``training_log``'s iteration line (megatron/training/training.py), with the number of
  iterations the loss scaler skipped in the interval;
* PyTorch's CUDA out-of-memory message (c10/cuda/CUDACachingAllocator.cpp), all its variants.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# One pattern, one alternative per launcher; removed from the start of a line repeatedly.
_PREFIX = re.compile(
    # torchrun --tee: [default0]: (role + local rank); a prefix template: [rank3]:
    r"\[(?P<role>[A-Za-z_]*?)(?P<local>\d+)\]:"
    # [host:rank]: wrappers
    r"|\[(?P<host>[A-Za-z0-9][\w.-]*):(?P<grank>\d+)\]:"
    # srun --label: "3: " (padded " 3: "; heterogeneous jobs "1 3: ")
    r"| *(?:\d+ )?(?P<task>\d+): "
    # pdsh: "host: " (a host name holds a digit, so "Traceback: " or "ERROR: " is not one)
    r"|(?P<pdsh>[A-Za-z][\w.-]*\d[\w.-]*): "
    # timestamps a wrapper or Megatron adds: [2025-03-31 05:54:07], 2024-04-04T09:09:53.313Z
    r"|\[?\d{4}-\d{2}-\d{2}[T _]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]?:?\s*"
    r"|\[?\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\]?\s+"
)
#: Words one of which every line the reader uses holds (searched in the raw bytes: a line
#: without any is not even decoded).
KEYWORDS = re.compile(
    rb"memory \([MG]B\)|iteration|out of memory|Theoretical|world size|padded vocab|\.py|arguments"
    rb"|_ARGS: --|most loaded shard"
)
MAX_PREFIXES = 4  # prefixes removed from one line, at most


@dataclass(frozen=True)
class Tagged:
    """A line without its launcher prefixes: ``tag`` names the writer (``default0``,
    ``host:3``, ``3``; empty without one), ``rank`` is the global rank when the prefix
    says it (srun's label, ``[host:rank]:``, a ``rank`` template), else None."""

    text: str
    tag: str
    rank: int | None


def untag(line: str) -> Tagged:
    """``line`` with its launcher prefixes and timestamps removed."""
    tag, rank = "", None
    for _ in range(MAX_PREFIXES):
        m = _PREFIX.match(line)
        if m is None or m.end() == 0:
            break
        groups = m.groupdict()
        if groups["local"] is not None:
            role = groups["role"] or ""
            tag = tag or f"{role}{groups['local']}"
            if role.lower() == "rank":
                rank = int(groups["local"])
        elif groups["grank"] is not None:
            tag, rank = tag or f"{groups['host']}:{groups['grank']}", int(groups["grank"])
        elif groups["task"] is not None:
            tag, rank = tag or groups["task"], int(groups["task"])
        elif groups["pdsh"] is not None:
            tag = tag or groups["pdsh"]
        line = line[m.end() :]
    return Tagged(line, tag, rank)


_NUM = r"([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"
MEMORY = re.compile(
    r"(?:\[Rank (?P<rank>\d+)\] )?\(?after (?P<iteration>\d+) iterations\)? memory \(MB\)"
    rf" \| allocated: {_NUM} \| max allocated: {_NUM} \| (?:reserved|cached): {_NUM}"
    rf" \| max (?:reserved|cached): {_NUM}"
)
# Megatron-Bridge: "[Rank 1] (after 2 iterations) memory (GB) | mem-allocated-gigabytes: 63.66 |
# mem-active-gigabytes: ... | mem-max-allocated-gigabytes: 153.4 | ..." (its memory_keys choose
# the fields; bytes / 1e9 rounded to 5 significant digits)
MEMORY_GB = re.compile(
    r"(?:\[Rank (?P<rank>\d+)\] )?\(after (?P<iteration>\d+) iterations\) memory \(GB\)"
    r"(?P<fields>(?: \| [\w-]+: [^|\s]+)+)"
)
_GB_FIELD = re.compile(rf"\| ([\w-]+): {_NUM}")
#: The Bridge fields that are report_memory's four figures, in its order.
GB_FIELDS = ("mem-allocated-gigabytes", "mem-max-allocated-gigabytes", "mem-reserved-gigabytes",
             "mem-max-reserved-gigabytes")  # fmt: skip
_GB_IN_MB = 1e9 / 2**20
THEORETICAL = re.compile(
    rf"Theoretical memory footprints: weight and optimizer={_NUM} MB"
    rf"(?:, activation={_NUM} MB, total={_NUM} MB)?"
)
# report_theoretical_memory's parameter count of the first stage's tensor-parallel shard
SHARD_PARAMS = re.compile(rf"Number of parameters in most loaded shard in billions: *{_NUM}")
ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+) \|")
SKIPPED = re.compile(r"number of skipped iterations:\s*(\d+)")
ARGS_START = "------------------------ arguments ------------------------"
ARGS_END = "-------------------- end of arguments ---------------------"
# _print_args: '  {name} {dots} {value}' with dots = '.' * (48 - len(name))
ARG_LINE = re.compile(r"^\s*([A-Za-z_]\w*) \.+ (.*)$|^\s*([A-Za-z_]\w{47,})  (.*)$")
WORLD = re.compile(r"using world size: (\d+)")
PADDED_VOCAB = re.compile(r"padded vocab \(size: (\d+)\) with (\d+) dummy tokens")
# a Megatron entry point followed by its flags
COMMAND = re.compile(r"(?:^|[\s/])((?:pre)?train_\w+\.py)\s+(--\S.*)$")
# a launch script echoing its flag groups before it runs the entry point with all of them
# ("MODEL_ARGS: --num-layers 24 ...", the bash arrays Megatron-LM's examples build)
ARG_GROUP = re.compile(r"^([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_ARGS): +(--\S.*)$")
TORCHRUN = re.compile(r"(?:torchrun|torch\.distributed\.(?:launch|run))\s")

# --- PyTorch's out-of-memory message ---------------------------------------------------
OOM = re.compile(r"(?:CUDA|HIP) out of memory\. Tried to allocate ")
_SIZE = r"(\d+(?:\.\d+)?) ?(B|bytes|KiB|MiB|GiB|TiB)"
_UNITS = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
OOM_FIELDS = {
    "requested": re.compile(r"Tried to allocate " + _SIZE),
    "total": re.compile(_SIZE + r" total capacity|total capac(?:i)?ty of " + _SIZE),
    "free": re.compile(r"of which " + _SIZE + r" (?:is )?free|; " + _SIZE + r" free"),
    "allocated": re.compile(
        r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch|" + _SIZE + " already "
        r"allocated"
    ),
    "reserved_unallocated": re.compile(_SIZE + r" is reserved by PyTorch but unallocated"),
    "reserved_total": re.compile(_SIZE + r" reserved in total by PyTorch"),
    "process_in_use": re.compile(r"this process has " + _SIZE + r" memory in use"),
}
OOM_DEVICE = re.compile(r"GPU (\d*)")


def size_bytes(match: re.Match[str] | None) -> int | None:
    """Bytes of the first ``number unit`` pair a match captured (``format_size``'s units)."""
    if match is None:
        return None
    groups = [g for g in match.groups() if g is not None]
    return int(float(groups[0]) * _UNITS[groups[1]])


@dataclass(frozen=True)
class MemoryReading:
    """One memory report found in a line: MB (2**20 bytes) whatever unit it was printed in."""

    rank: int | None  # from ``[Rank N]``; None when the line does not say
    iteration: int
    allocated_mb: float
    max_allocated_mb: float
    reserved_mb: float
    max_reserved_mb: float


def memory_readings(text: str) -> list[MemoryReading]:
    """Every memory report in ``text`` (ranks printing at once can share a line); a Bridge
    line without one of the four figures (custom ``memory_keys``) is not one."""
    out = []
    for m in MEMORY.finditer(text):
        rank = int(m.group("rank")) if m.group("rank") is not None else None
        values = [float(m.group(i)) for i in range(3, 7)]
        out.append(MemoryReading(rank, int(m.group("iteration")), *values))
    for m in MEMORY_GB.finditer(text):
        fields = dict(_GB_FIELD.findall(m.group("fields")))
        if not all(name in fields for name in GB_FIELDS):
            continue
        rank = int(m.group("rank")) if m.group("rank") is not None else None
        gb = [float(fields[name]) * _GB_IN_MB for name in GB_FIELDS]
        out.append(MemoryReading(rank, int(m.group("iteration")), *gb))
    return out
