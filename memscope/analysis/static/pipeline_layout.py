"""Megatron's ``pipeline_model_parallel_layout``: which (pipeline rank, virtual chunk) builds
the embedding, which decoder layers, the MTP layers and the loss.

megatron-core 0.16.1 (megatron/core/transformer/pipeline_parallel_layer_layout.py,
``PipelineParallelLayerLayout``) reads a string such as ``"Et*3|(tt|)*29,m|L"``: ``|``
separates virtual stages, ``E`` is the embedding, ``t`` a decoder layer, ``m`` an MTP layer,
``L`` the loss (output layer); ``x*n`` and ``(...)*n`` repeat, commas are cosmetic. Stage
``i`` of the flat list belongs to pipeline rank ``i % pp`` and virtual chunk ``i // pp``, so
``len(stages) / pp`` is the virtual pipeline size. Decoder layers are numbered in that flat
order (``get_layer_offset``). Pure functions on plain strings; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYER_CHARS = frozenset("EtmL")  # megatron's char2layer_type keys
MAX_EXPANDED = 1 << 16  # characters once repeats are unrolled (a real layout has < 1000)


def _expand(text: str) -> str:
    """``text`` with every ``x*n`` and ``(...)*n`` repeated out (parentheses may nest)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == ")":
            raise ValueError("pipeline_model_parallel_layout: unbalanced ')'")
        if ch == "(":
            depth, j = 1, i + 1
            while j < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            if depth:
                raise ValueError("pipeline_model_parallel_layout: unbalanced '('")
            unit, i = _expand(text[i + 1 : j - 1]), j
        else:
            unit, i = ch, i + 1
        if i < len(text) and text[i] == "*":
            k = i + 1
            while k < len(text) and text[k].isdigit():
                k += 1
            if k == i + 1:
                raise ValueError("pipeline_model_parallel_layout: '*' must be followed by a count")
            unit, i = unit * int(text[i + 1 : k]), k
        out.append(unit)
        if sum(map(len, out)) > MAX_EXPANDED:
            raise ValueError(
                f"pipeline_model_parallel_layout: more than {MAX_EXPANDED} entries once "
                "its repeats are unrolled"
            )
    return "".join(out)


def parse_layout(text: str) -> tuple[str, ...]:
    """The flat stages of a layout string, each the string of its layer characters."""
    expanded = _expand(text.replace(",", "").replace(" ", ""))
    stages = tuple(expanded.split("|"))
    bad = sorted(set(expanded) - LAYER_CHARS - {"|"})
    if bad:
        raise ValueError(
            f"pipeline_model_parallel_layout: unknown layer character(s) {''.join(bad)!r} "
            "(E embedding, t decoder layer, m MTP layer, L loss)"
        )
    return stages


def validate_layout(
    stages: tuple[str, ...], pp: int, num_layers: int, mtp_num_layers: int | None
) -> None:
    """The checks of megatron-core's ``PipelineParallelLayerLayout.__init__`` and
    ``validate_layer_layout``, each refused as a ``ValueError`` naming the rule."""
    name = "pipeline_model_parallel_layout"
    if len(stages) % pp:
        raise ValueError(f"{name}: {len(stages)} stages are not divisible by parallel.pp ({pp})")
    flat = "".join(stages)
    if not flat or flat[0] != "E" or flat[-1] != "L":
        raise ValueError(f"{name}: must start with the embedding (E) and end with the loss (L)")
    if flat.count("E") != 1 or flat.count("L") != 1:
        raise ValueError(f"{name}: the embedding (E) and the loss (L) must appear exactly once")
    if flat.count("t") != num_layers:
        raise ValueError(
            f"{name}: {flat.count('t')} decoder layers (t), model.num_layers is {num_layers}"
        )
    if flat.count("m") != (mtp_num_layers or 0):
        raise ValueError(
            f"{name}: {flat.count('m')} MTP layers (m), mtp_num_layers is {mtp_num_layers}"
        )
    if "m" in flat and "t" in flat[flat.index("m") :]:
        raise ValueError(f"{name}: decoder layers (t) must come before the MTP layers (m)")
    vpp = len(stages) // pp
    holders = [i for i, s in enumerate(stages) if "m" in s]
    if holders:
        if len(holders) > 1 or stages[holders[0]].count("m") != mtp_num_layers:
            raise ValueError(f"{name}: all MTP layers (m) must be in one virtual stage")
        if holders[0] // pp != vpp - 1:
            raise ValueError(
                f"{name}: the MTP layers (m) must be in the last virtual stage of their "
                "pipeline rank (megatron-core 0.16.1)"
            )


def with_mtp_on_last_chunk(stages: tuple[str, ...], mtp_num_layers: int | None) -> tuple[str, ...]:
    """A layout as megatron-core before 0.15 built it: the layout may not name the MTP layers
    (``validate_layer_layout`` raised ``NotImplementedError`` for an ``m``) and
    ``multi_token_prediction.py`` ``get_mtp_num_layers_to_build`` put them all on the last
    stage, the loss's chunk: ``m`` x ``mtp_num_layers`` placed before its ``L``
    (``megatron_versions.MTP_IN_LAYOUT``)."""
    if any("m" in s for s in stages):
        raise ValueError(
            "pipeline_model_parallel_layout: megatron-core before 0.15 places no MTP layer (m) "
            "in a layout (NotImplementedError there): they are built on the last stage"
        )
    if not mtp_num_layers:
        return stages
    last = stages[-1]
    cut = last.index("L") if "L" in last else len(last)
    return (*stages[:-1], last[:cut] + "m" * mtp_num_layers + last[cut:])


def format_layout(stages: tuple[str, ...]) -> str:
    """``stages`` as a layout string megatron-core parses back to them: ``x*n`` for a run of
    one layer character, ``(...|)*n`` for a run of equal stages, where shorter
    (:func:`parse_layout`)."""

    def stage(text: str) -> str:
        runs: list[str] = []
        i = 0
        while i < len(text):
            j = i
            while j < len(text) and text[j] == text[i]:
                j += 1
            short = f"{text[i]}*{j - i}"
            runs.append(short if len(short) < j - i else text[i] * (j - i))
            i = j
        return "".join(runs)

    parts: list[str] = []
    i = 0
    while i < len(stages):
        j = i
        while j < len(stages) - 1 and stages[j] == stages[i]:
            j += 1  # the last stage is never in a repeat: a repeat ends with '|'
        repeat = f"({stage(stages[i])}|)*{j - i}"
        if j - i > 1 and len(repeat) < (j - i) * (len(stage(stages[i])) + 1):
            parts.append(repeat)
            i = j
        else:
            parts.append(stage(stages[i]) + ("|" if i < len(stages) - 1 else ""))
            i += 1
    return "".join(parts)


def layout_vpp(stages: tuple[str, ...], pp: int) -> int | None:
    """The virtual pipeline size the layout implies (Megatron-LM arguments.py: ``None`` for
    one stage per rank)."""
    vpp = len(stages) // pp
    return vpp if vpp > 1 else None


def stage_chunk(stages: tuple[str, ...], pp: int, pp_rank: int, chunk: int) -> str:
    """The layer characters of pipeline rank ``pp_rank``'s virtual chunk ``chunk``."""
    return stages[chunk * pp + pp_rank]


@dataclass(frozen=True)
class ChunkRoles:
    """What one (pipeline rank, virtual chunk) builds besides its decoder layers.

    megatron-core 0.16.1 ``GPTModel.__init__``: the embedding where ``pre_process`` (first
    rank, first chunk) or ``mtp_process`` (the chunk holding the MTP layers, a tied copy);
    the output layer where ``post_process`` (last rank, last chunk); the decoder's final
    norm where ``post_process``, or with MTP on the chunk holding the last decoder layer
    (``TransformerBlock.has_final_layernorm_in_this_stage``)."""

    embedding: bool
    loss: bool
    mtp: bool
    final_norm: bool
    first: bool  # pre_process: the token ids and the embedding's output start here


def mtp_chunk(pp: int, vpp: int, stages: tuple[str, ...] | None) -> tuple[int, int] | None:
    """(pipeline rank, chunk) holding the MTP layers: the layout's ``m`` stage, else the
    last rank's last chunk (megatron-core ``mtp_on_this_rank``). None without a layout 'm'."""
    if stages is None:
        return (pp - 1, vpp - 1)
    for i, s in enumerate(stages):
        if "m" in s:
            return (i % pp, i // pp)
    return None
