"""The static estimate of a Megatron run: MemScope's own estimator by default, over the
attached model's own settings (:mod:`.model_spec`) and the run's args for the rest, or a
provider the caller gives; and how the report's ``training.static_spec`` names its source."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memscope.capture.device import device_type
from memscope.capture.parallel import ParallelInfo
from memscope.inputs.inrun import ModelFacts
from memscope.integrations.megatron.training_settings import SPEC_FROM_ARGS, SPEC_FROM_MODEL

#: ``provider(args, parallel)``: a caller's own estimate for this rank, or ``None``.
StaticEstimateProvider = Callable[[Any, ParallelInfo], dict[str, Any] | None]


def default_static_estimate(
    args: Any, parallel: ParallelInfo, model: ModelFacts | None = None
) -> dict[str, Any]:
    """MemScope's own per-rank estimate: the attached model's own settings
    (:func:`.model_spec.read_model_facts`), this run's Megatron args for the rest."""
    from memscope.inputs.runtime_estimate import estimate_for_runtime

    if args is None and model is None:
        raise ValueError(
            "no Megatron args were given to the runtime (from_megatron_args) and no "
            "megatron-core model is attached"
        )
    return estimate_for_runtime(args, parallel, device=device_type(), model=model)


def run_estimate(
    provider: StaticEstimateProvider, args: Any, parallel: ParallelInfo, model: ModelFacts | None
) -> dict[str, Any] | None:
    """Ask ``provider`` (the default one also gets the attached model's settings)."""
    if provider is default_static_estimate:
        return default_static_estimate(args, parallel, model)
    return provider(args, parallel)


def spec_source(provider: StaticEstimateProvider | None, model: ModelFacts | None) -> str | None:
    """Where the static comparison's spec came from (``None``: no static comparison)."""
    if provider is None:
        return None
    if provider is default_static_estimate:
        return SPEC_FROM_MODEL if model is not None else SPEC_FROM_ARGS
    return f"{getattr(provider, '__qualname__', type(provider).__name__)} (custom provider)"
