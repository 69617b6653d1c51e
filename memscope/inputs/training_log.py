"""Stream Megatron-LM / FlagScale training logs into runs, in bounded memory.

A log is read line by line (plain or gzip; one file per node; a FlagScale ``logs/`` folder's
``host_*.output``), launcher prefixes removed (:mod:`.log_lines`). What a run keeps is
bounded whatever the log's size: its arguments (one block, capped), the ``report_memory``
lines, the theoretical-memory line, the iteration lines' skip counts and the out-of-memory
messages, each list capped. Two runs written into one file (an arguments block after one
that already trained, or an iteration number going back) become two runs, never mixed.

Every problem with the input is an :class:`~memscope.events.bounded_input.InputRefused`
with a one-line message.
"""

from __future__ import annotations

import gzip
import os
import shlex
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from memscope.events.bounded_input import InputRefused, open_regular
from memscope.inputs import log_lines as L

#: Largest log file read (plain bytes; a gzip file's decompressed bytes are capped the same).
MAX_LOG_BYTES = 64 * 2**30
#: Longest line kept whole (a longer one is cut: no memory line comes near it).
MAX_LINE_BYTES = 1 << 20
#: Longest command held together from lines continued with a backslash.
MAX_JOINED_BYTES = 1 << 20
#: Lines of an arguments block (Megatron prints about 500-900).
MAX_ARG_LINES = 20_000
#: Records kept per run (memory lines, iteration lines, out-of-memory messages).
MAX_RECORDS = 100_000
#: Distinct prefix ranks kept of the iteration lines' writers (one is expected).
MAX_PREFIX_RANKS = 8
#: Files of one call (one per node).
MAX_FILES = 4096
#: Bytes sniffed for binary junk at the start of each file.
SNIFF_BYTES = 64 * 1024
MIB = 2**20


@dataclass(frozen=True)
class MemoryLine:
    """One ``report_memory`` line (MB = 2**20 bytes, as ``torch.cuda.memory_*() / 2**20``)."""

    rank: int
    iteration: int
    allocated_mb: float
    max_allocated_mb: float
    reserved_mb: float
    max_reserved_mb: float
    where: str  # file:line


@dataclass(frozen=True)
class IterationLine:
    iteration: int
    skipped: int  # iterations the loss scaler skipped in this log interval


@dataclass(frozen=True)
class OomMessage:
    """PyTorch's out-of-memory message; sizes in bytes, None where the variant lacks it."""

    rank: int | None
    tag: str
    node: int | None  # the FlagScale host file's node rank (with a local-rank tag)
    device: int | None
    requested: int | None
    total: int | None
    free: int | None
    allocated: int | None
    reserved_unallocated: int | None
    process_in_use: int | None
    where: str
    text: str


@dataclass(frozen=True)
class Theoretical:
    weight_and_optimizer_mb: float
    activation_mb: float | None
    total_mb: float | None


@dataclass
class LogRun:
    """What one training run printed."""

    index: int
    sources: list[str] = field(default_factory=list)
    args: dict[str, str] | None = None  # the arguments block, values as printed
    args_where: str = ""
    command: dict[str, Any] | None = None  # the launch command line's flags
    command_where: str = ""
    launcher_world_size: int | None = None  # torchrun --nnodes x --nproc-per-node
    world_size: int | None = None  # "using world size: N"
    unpadded_vocab: int | None = None  # "padded vocab (size: N) ..."
    memory: list[MemoryLine] = field(default_factory=list)
    iterations: list[IterationLine] = field(default_factory=list)
    theoretical: Theoretical | None = None
    shard_params_b: float | None = None  # "Number of parameters in most loaded shard" (1e9)
    # the prefix ranks of the iteration lines' writers (``print_rank_last``: the last global
    # rank, so a prefix number other than world size - 1 is no global rank); a few kept
    iteration_prefix_ranks: set[int] = field(default_factory=set)
    ooms: list[OomMessage] = field(default_factory=list)
    dropped: int = 0  # records over MAX_RECORDS (counted, not kept)
    cut_lines: int = 0  # lines longer than MAX_LINE_BYTES
    unfinished_args_where: str = ""  # a later arguments block without its end line, not read

    @property
    def trained(self) -> bool:
        return bool(self.memory or self.iterations or self.ooms)

    @property
    def last_iteration(self) -> int | None:
        return self.iterations[-1].iteration if self.iterations else None

    def merge(self, other: LogRun) -> None:
        """Add what another node's file printed for the same run."""
        for name in ("args", "command", "launcher_world_size", "world_size", "unpadded_vocab",
                     "theoretical", "shard_params_b"):  # fmt: skip
            if getattr(self, name) is None and getattr(other, name) is not None:
                setattr(self, name, getattr(other, name))
        self.args_where = self.args_where or other.args_where
        self.command_where = self.command_where or other.command_where
        self.memory += other.memory
        self.ooms += other.ooms
        if len(other.iterations) > len(self.iterations):
            self.iterations = other.iterations
        self.sources += [s for s in other.sources if s not in self.sources]
        self.iteration_prefix_ranks |= other.iteration_prefix_ranks
        self.dropped += other.dropped
        self.cut_lines += other.cut_lines
        self.unfinished_args_where = self.unfinished_args_where or other.unfinished_args_where


def log_files(paths: list[str]) -> list[str]:
    """The files to read: each path itself, or a FlagScale ``logs/`` folder's
    ``host_*.output`` (``host.output``), in node order."""
    out: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            names = sorted(
                (n for n in os.listdir(path) if n.startswith("host") and n.endswith(".output")),
                key=_node_order,
            )
            if not names:
                raise InputRefused(
                    f"{path}: a folder without host_*.output files (a FlagScale logs/ folder "
                    "holds one per node)"
                )
            out += [os.path.join(path, n) for n in names]
        else:
            out.append(path)
    if len(out) > MAX_FILES:
        raise InputRefused(f"{len(out)} log files: more than the {MAX_FILES} read at once")
    return out


def _node_order(name: str) -> tuple[int, str]:
    parts = name.split("_")
    return (int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0, name)


def read_runs(paths: list[str]) -> list[LogRun]:
    """The runs in ``paths`` (files or FlagScale ``logs/`` folders). Several files are the
    nodes of one job: their first runs are one run, their second runs another, ..."""
    merged: list[LogRun] = []
    for path in log_files(paths):
        for run in read_file_runs(path):
            if run.index < len(merged):
                merged[run.index].merge(run)
            else:
                merged.append(run)
    return merged


def read_file_runs(path: str) -> list[LogRun]:
    """The runs of one log file."""
    reader = _Reader(path)
    wanted = L.KEYWORDS.search
    for number, raw in enumerate(_lines(path), 1):
        idle = reader.block is None and reader.held is None and not reader.dropping
        if idle and raw is not CUT and not wanted(raw) and not raw.endswith(CONTINUED):
            continue  # nothing the reader uses: not even decoded
        line = "\x00cut" if raw is CUT else raw.decode("utf-8", errors="replace").rstrip("\r\n")
        reader.feed(line, number)
    return reader.finish()


CUT = b"\x00cut"  # what _decoded yields for a line over MAX_LINE_BYTES
CONTINUED = (b"\\\n", b"\\\r\n", b"\\ \n", b"\\")  # a line a backslash continues


def _lines(path: str) -> Iterator[bytes]:
    raw = open_regular(path, None)
    with raw:
        head = raw.read(2)
        raw.seek(0)
        stream: IO[bytes] = raw
        if head == b"\x1f\x8b":
            stream = gzip.GzipFile(fileobj=raw)  # type: ignore[assignment]
        try:
            yield from _decoded(stream, path)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputRefused(f"{path}: a damaged gzip stream ({exc})") from None


def _decoded(stream: IO[bytes], path: str) -> Iterator[bytes]:
    total = 0
    first = True
    while True:
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        total += len(line)
        if total > MAX_LOG_BYTES:
            raise InputRefused(f"{path}: larger than the {MAX_LOG_BYTES // 2**30} GiB read")
        if first or total <= SNIFF_BYTES:
            _refuse_binary(line, path)
            first = False
        if len(line) > MAX_LINE_BYTES:  # the rest of a cut line is skipped
            while line and not line.endswith(b"\n"):
                line = stream.readline(MAX_LINE_BYTES)
                total += len(line)
            yield CUT
            continue
        yield line


def _refuse_binary(line: bytes, path: str) -> None:
    if b"\x00" in line:
        raise InputRefused(f"{path}: binary data (NUL bytes), not a text training log")
    text = line.decode("utf-8", errors="replace")
    bad = sum(1 for c in text if c == "\ufffd" or (ord(c) < 32 and c not in "\t\r\n\x1b"))
    if len(text) >= 16 and bad > len(text) // 4:
        raise InputRefused(f"{path}: binary data, not a text training log")


class _Reader:
    """One file's state machine: outside or inside an arguments block."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.runs: list[LogRun] = [LogRun(0, [path])]
        self.block: dict[str, str] | None = None
        self.block_tag = ""
        self.block_start = 0
        self.held: list[str] | None = None  # the parts of a line continued with a backslash
        self.held_from: tuple[L.Tagged, int] = (L.Tagged("", "", None), 0)
        self.held_size = 0
        self.dropping = False
        name = os.path.basename(path)  # FlagScale's host_{node_rank}_{host}.output
        self.node = _node_order(name)[0] if name.startswith("host_") else None

    @property
    def run(self) -> LogRun:
        return self.runs[-1]

    def _new_run(self) -> None:
        self.runs.append(LogRun(len(self.runs), [self.path]))

    def _where(self, number: int) -> str:
        return f"{os.path.basename(self.path)}:{number}"

    def feed(self, line: str, number: int) -> None:
        if line == "\x00cut":
            self.run.cut_lines += 1
            return
        tagged = L.untag(line)
        if self.block is not None:
            self._block_line(tagged, number)
            return
        text = tagged.text
        if self.held is not None or self.dropping or _continues(text):
            joined = self._joined(tagged, number)
            if joined is None:
                return  # a part of a continued line, held
            tagged, number = joined
            text = tagged.text
        if L.ARGS_START in text:
            if self.run.trained or self.run.args is not None:
                self._new_run()
            self.block, self.block_tag, self.block_start = {}, tagged.tag, number
            return
        self._content(tagged, number)

    def _joined(self, tagged: L.Tagged, number: int) -> tuple[L.Tagged, int] | None:
        """A command continued over lines with a trailing backslash (a launch script echoed
        into the log, ``cat $0``) as one line: its parts are held until the line that does not
        continue (at most :data:`MAX_JOINED_BYTES` of them, else they are dropped and counted)."""
        text = tagged.text.rstrip()
        continues = text.endswith("\\")
        if self.dropping:  # the rest of a command too long to hold
            self.dropping = continues
            return None
        if self.held is None:
            if not continues:
                return tagged, number
            self.held, self.held_from, self.held_size = [], (tagged, number), 0
        part = text[:-1].strip() if continues else text.strip()
        self.held.append(part)
        self.held_size += len(part) + 1
        if self.held_size > MAX_JOINED_BYTES:
            self.held, self.dropping = None, continues
            self.run.cut_lines += 1
            return None
        if continues:
            return None
        return self._release()

    def _release(self) -> tuple[L.Tagged, int]:
        assert self.held is not None
        first, number = self.held_from
        text = " ".join(part for part in self.held if part)
        self.held = None
        return L.Tagged(text, first.tag, first.rank), number

    def _block_line(self, tagged: L.Tagged, number: int) -> None:
        assert self.block is not None
        if L.ARGS_END in tagged.text:
            self.run.args, self.run.args_where = self.block, self._where(self.block_start)
            self.block = None
            return
        if tagged.tag != self.block_tag:
            self._content(tagged, number)  # another rank's line printed meanwhile
            return
        m = L.ARG_LINE.match(tagged.text)
        if m is None:
            return
        name, value = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        self.block[name] = value.strip()
        if len(self.block) > MAX_ARG_LINES:
            raise InputRefused(
                f"{self._where(self.block_start)}: an arguments block of more than "
                f"{MAX_ARG_LINES} lines"
            )

    def _content(self, tagged: L.Tagged, number: int) -> None:
        """One line outside an arguments block (a cheap substring test picks the pattern)."""
        text = tagged.text
        if "memory (MB)" in text or "memory (GB)" in text:
            self._memory(tagged, number)
        elif "iteration" in text and "|" in text:
            self._iteration(tagged)
        elif "out of memory" in text:
            if L.OOM.search(text):
                self._keep(self.run.ooms, _oom(tagged, self._where(number), self.node))
        else:
            self._other(text, number)

    def _memory(self, tagged: L.Tagged, number: int) -> None:
        for mem in L.memory_readings(tagged.text):  # ranks printing at once can share a line
            rank = mem.rank if mem.rank is not None else tagged.rank
            if rank is None and not tagged.tag:
                rank = 0  # old Megatron-LM printed it without [Rank N], from rank 0
            if rank is not None:
                figures = (mem.allocated_mb, mem.max_allocated_mb, mem.reserved_mb,
                           mem.max_reserved_mb)  # fmt: skip
                line = MemoryLine(rank, mem.iteration, *figures, self._where(number))
                self._keep(self.run.memory, line)

    def _iteration(self, tagged: L.Tagged) -> None:
        m = L.ITERATION.search(tagged.text)
        if m is None:
            return
        run = self.run
        iteration = int(m.group(1))
        if run.iterations and iteration <= run.iterations[-1].iteration:
            self._new_run()  # the iteration count went back: a new run in the same file
            run = self.run
        skipped = L.SKIPPED.search(tagged.text)
        count = int(skipped.group(1)) if skipped else 0
        self._keep(run.iterations, IterationLine(iteration, count))
        if tagged.rank is not None and len(run.iteration_prefix_ranks) < MAX_PREFIX_RANKS:
            run.iteration_prefix_ranks.add(tagged.rank)

    def _other(self, text: str, number: int) -> None:
        run = self.run
        m = L.THEORETICAL.search(text) if "Theoretical" in text else None
        if m is not None:
            act, total = m.group(2), m.group(3)
            run.theoretical = Theoretical(
                float(m.group(1)), float(act) if act else None, float(total) if total else None
            )
            return
        m = L.SHARD_PARAMS.search(text) if "most loaded shard" in text else None
        if m is not None:
            run.shard_params_b = float(m.group(1))
            return
        m = L.WORLD.search(text) if "world size" in text else None
        if m is not None:  # printed just before the arguments block: a next run's first line
            if run.trained or run.args is not None:
                self._new_run()
            self.run.world_size = int(m.group(1))
            return
        m = L.PADDED_VOCAB.search(text) if "padded vocab" in text else None
        if m is not None:
            run.unpadded_vocab = int(m.group(1))
            return
        m = L.ARG_GROUP.match(text) if "_ARGS: --" in text else None
        if m is not None:
            self._arg_group(m.group(2), number)
            return
        m = L.COMMAND.search(text) if ".py" in text else None
        if m is not None and run.trained:  # launched again after a run that trained
            self._new_run()
            run = self.run
        if m is not None and run.command is None:
            run.command, run.command_where = _flags(m.group(2)), self._where(number)
            launcher = text[: m.start(1)]
            if L.TORCHRUN.search(launcher):
                run.launcher_world_size = _torchrun_world(launcher)

    def _arg_group(self, flags_text: str, number: int) -> None:
        """One echoed flag group: the launcher's (``--nproc_per_node``) gives the world size,
        the others together are the entry point's command line."""
        if self.run.trained:  # a launch after a run that trained: the next run's flags
            self._new_run()
        run, flags = self.run, _flags(flags_text)
        if "nproc_per_node" in flags:
            run.launcher_world_size = _torchrun_world(flags_text)
            return
        if run.command is None:
            run.command, run.command_where = {}, self._where(number)
        for name, value in flags.items():
            run.command.setdefault(name, value)

    def _keep(self, records: list[Any], record: Any) -> None:
        if len(records) < MAX_RECORDS:
            records.append(record)
        else:
            self.run.dropped += 1

    def finish(self) -> list[LogRun]:
        if self.held is not None:  # the log ends inside a continued line
            tagged, number = self._release()
            self._content(tagged, number)
        kept = [r for r in self.runs if r.trained or r.args is not None or r.command]
        if self.block is not None:
            where = self._where(self.block_start)
            if not kept:  # nothing else in the file: the log itself is cut
                raise InputRefused(
                    f"{where}: the arguments block has no "
                    f"'{L.ARGS_END.strip('-').strip()}' line (a truncated log?)"
                )
            # what came before it stands; the unfinished block is not read, and said so
            kept[-1].unfinished_args_where = where
        return kept


def _continues(text: str) -> bool:
    """Whether a line ends in a backslash (spaces after it allowed): a shell line continued."""
    return text.endswith("\\") or (text.endswith((" ", "\t")) and text.rstrip().endswith("\\"))


def _oom(tagged: L.Tagged, where: str, node: int | None) -> OomMessage:
    text = tagged.text
    sizes = {name: L.size_bytes(p.search(text)) for name, p in L.OOM_FIELDS.items()}
    reserved_unallocated = sizes["reserved_unallocated"]
    if reserved_unallocated is None and sizes["reserved_total"] is not None:
        allocated = sizes["allocated"] or 0  # torch <= 2.0: reserved in total
        reserved_unallocated = max(0, sizes["reserved_total"] - allocated)
    device = L.OOM_DEVICE.search(text)
    return OomMessage(
        rank=tagged.rank,
        tag=tagged.tag,
        node=node,
        device=int(device.group(1)) if device and device.group(1) else None,
        requested=sizes["requested"],
        total=sizes["total"],
        free=sizes["free"],
        allocated=sizes["allocated"],
        reserved_unallocated=reserved_unallocated,
        process_in_use=sizes["process_in_use"],
        where=where,
        text=text[text.find("out of memory") - 5 :][:600],
    )


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote: plain words
        return text.split()


def _flags(text: str) -> dict[str, Any]:
    """``--flag-name value ...`` as Megatron's argparse names them (``flag_name``); a flag
    without a value is True, one with several values a list."""
    out: dict[str, Any] = {}
    name: str | None = None
    for word in _split(text):
        if word.startswith("--") and len(word) > 2:
            key, _, value = word[2:].partition("=")
            name = key.replace("-", "_")
            out[name] = value if value else True
            if value:
                name = None
        elif name is not None:
            held = out[name]
            listed = held if isinstance(held, list) else [held]
            out[name] = word if held is True else [*listed, word]
    return out


def _torchrun_world(text: str) -> int | None:
    flags = _flags(text[text.find("--") :]) if "--" in text else {}
    nproc, nnodes = flags.get("nproc_per_node"), flags.get("nnodes", "1")
    try:
        return int(str(nproc)) * int(str(nnodes).split(":")[-1])
    except ValueError:
        return None
