"""The in-run spec's inputs: what the attached model says first, the run's args for the rest.

In a run the estimator sees more than a config file: the model itself. Its
``TransformerConfig`` and module classes (read by ``memscope.integrations``, which touches
torch, into a :class:`ModelFacts` of plain values under Megatron's argument names) are what
runs, while an args namespace may lack keys (a missing key takes Megatron-LM's command-line
default, which for the fusions and ``transformer_impl`` is the opposite of megatron-core's) or
be absent (a megatron-core model driven by another trainer). :func:`inrun_inputs` merges the
three sources key by key -- the model, then the args, then the run's own settings (batch
sizes, optimizer, data parallelism a trainer passes or the adapter discovers) -- and lists
every key where the model and the args disagree. Torch-free: only plain values come in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memscope.analysis.static.read_keys import READ_KEYS

MODEL = "model"
ARGS = "args"
SETTINGS = "run settings"

# Keys the model gives that restate another one it gives (compared once, under the other).
_RESTATED = frozenset({"disable_bias_linear"})
# Model settings the estimator has no term for yet: still read, merged and compared, so a
# disagreement about them is reported (megatron-core TransformerConfig names).
NOT_MODELLED = frozenset({"bias_dropout_fusion", "persist_layer_norm"})
# A model driven by another trainer has no Megatron-LM dataloader: its batches carry no
# GPTDataset attention mask unless that trainer's settings say otherwise.
NO_MEGATRON_DATALOADER = {"create_attention_mask_in_dataloader": False}
# What may come from the model: everything the args reader reads, and the above.
MODEL_KEYS = READ_KEYS | NOT_MODELLED


@dataclass(frozen=True)
class ModelFacts:
    """What the attached model says, under Megatron's argument names.

    ``values``: plain values (bool, int, float, str, lists of them, None) read from the
    chunks' ``TransformerConfig`` and modules; ``chunk_layers`` / ``chunk_embedding`` /
    ``chunk_output``: per model chunk on this rank, its decoder layers and whether it holds
    the word embedding / the output layer; ``notes``: what the reading could not settle."""

    values: Mapping[str, Any]
    chunk_layers: tuple[int, ...] = ()
    chunk_embedding: tuple[bool, ...] = ()
    chunk_output: tuple[bool, ...] = ()
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.values) - MODEL_KEYS)
        assert not unknown, f"model facts under names the estimator does not read: {unknown}"


@dataclass(frozen=True)
class Disagreement:
    """One setting where the run's args and its model differ (the model's value is used)."""

    key: str
    model: Any
    args: Any

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "model": _jsonable(self.model), "args": _jsonable(self.args)}


@dataclass(frozen=True)
class InrunInputs:
    """The merged inputs (Megatron names), where each came from, and the disagreements."""

    values: dict[str, Any]
    sources: dict[str, str]
    disagreements: tuple[Disagreement, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """The report's view: inputs and their sources (JSON-ready)."""
        return {
            "spec_inputs": {k: _jsonable(v) for k, v in sorted(self.values.items())},
            "spec_sources": dict(sorted(self.sources.items())),
            "spec_disagreements": [d.to_dict() for d in self.disagreements],
            "spec_notes": list(self.notes),
        }


def _present(source: Any) -> dict[str, Any]:
    """The keys an args namespace or mapping sets (``None`` counts as unset, as the args
    reader treats it)."""
    if source is None:
        return {}
    items = source.items() if isinstance(source, Mapping) else vars(source).items()
    return {k: v for k, v in items if v is not None}


def inrun_inputs(
    model: ModelFacts | None, args: Any = None, settings: Mapping[str, Any] | None = None
) -> InrunInputs:
    """Merge key by key: the model's value, else the args', else the run settings'.

    Keys the estimator does not read are dropped from the args (a Megatron namespace holds
    hundreds). Raises ``ValueError`` when there is nothing to describe the model."""
    given_args = {k: v for k, v in _present(args).items() if k in MODEL_KEYS}
    if given_args.get("group_query_attention") is False:  # Megatron-LM then ignores the
        given_args.pop("num_query_groups", None)  # groups (--num-query-groups defaults to 1)
    given_model = dict(model.values) if model is not None else {}
    given_settings = {k: v for k, v in _present(settings).items() if k in MODEL_KEYS}
    if args is None:  # no Megatron-LM args, no Megatron-LM dataloader (nor its batch mask)
        given_settings = {**NO_MEGATRON_DATALOADER, **given_settings}
    if not given_model and not given_args:
        raise ValueError(
            "neither a megatron-core model (TransformerConfig) nor Megatron args describe the model"
        )
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, given in ((SETTINGS, given_settings), (ARGS, given_args), (MODEL, given_model)):
        for key, value in given.items():
            values[key], sources[key] = value, name
    disagreements = tuple(
        Disagreement(key, given_model[key], given_args[key])
        for key in sorted(set(given_model) & set(given_args) - _RESTATED)
        if _norm(given_model[key]) != _norm(given_args[key])
    )
    notes = tuple(model.notes) if model is not None else ()
    return InrunInputs(values, sources, disagreements, notes)


def chunk_disagreements(
    facts: ModelFacts, expected_layers: tuple[int, ...], first_stage: bool, last_stage: bool
) -> tuple[Disagreement, ...]:
    """Where the estimator's layer split or embedding/output placement (for this pipeline
    stage) differs from the chunks the model holds: ``expected_layers`` per chunk as the
    estimator splits them (``params.layers_per_chunk``)."""
    out = []
    if facts.chunk_layers and tuple(facts.chunk_layers) != tuple(expected_layers):
        split = Disagreement("layers_per_chunk", list(facts.chunk_layers), list(expected_layers))
        out.append(split)
    if facts.chunk_embedding and any(facts.chunk_embedding) != first_stage:
        out.append(Disagreement("holds_embedding", any(facts.chunk_embedding), first_stage))
    if facts.chunk_output and any(facts.chunk_output) != last_stage:
        out.append(Disagreement("holds_output_layer", any(facts.chunk_output), last_stage))
    return tuple(out)


def _norm(value: Any) -> Any:
    """A value as both sources can spell it: torch dtypes and enums by their last dotted
    name (``torch.bfloat16`` -> ``bfloat16``, ``AttnBackend.auto`` -> ``auto``), strings
    lower-case, lists as tuples, integral floats as ints."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return int(value) if float(value).is_integer() else float(value)
    if isinstance(value, (list, tuple)):
        return tuple(_norm(v) for v in value)
    return str(value).strip().lower().rsplit(".", 1)[-1]


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(_norm(value))
