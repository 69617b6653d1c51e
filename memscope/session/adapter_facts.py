"""What a framework adapter tells a session: its static estimate, its own metadata and
training settings, which tensor attributes hold gradients, and the training's dashboards.
Each callable is asked when needed; a static estimator that fails is reported in the report's
comparison, never raised."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memscope.analysis.static_comparison import StaticEstimate
from memscope.session.step_peaks import Sink

#: Returns the estimate (the estimator's ``estimate_for_runtime`` dict), or ``None``.
StaticEstimateProvider = Callable[[], dict[str, Any] | None]
NO_ESTIMATOR_REASON = "static estimation is off (static_estimate_provider=None)"


def resolve_static_estimate(
    provider: StaticEstimateProvider | None, no_provider_reason: str = NO_ESTIMATOR_REASON
) -> StaticEstimate:
    """Ask ``provider`` once; a failing estimator is reported, never raised."""
    if provider is None:
        return StaticEstimate(None, no_provider_reason)
    try:
        estimate = provider()
    except ValueError as exc:  # a config the estimator does not model, said as such
        return StaticEstimate(None, f"no static estimate: {exc}")
    except Exception as exc:
        return StaticEstimate(None, f"the static estimator failed: {type(exc).__name__}: {exc}")
    if estimate is None:
        return StaticEstimate(None)
    return StaticEstimate(estimate)


@dataclass(frozen=True)
class AdapterFacts:
    """The framework's side of a :class:`~memscope.session.TracingSession`."""

    #: The static estimate to compare with (asked once, at start); ``None``: no comparison.
    static_estimate: StaticEstimateProvider | None = None
    #: Why there is no comparison when ``static_estimate`` is ``None``.
    no_estimate_reason: str = NO_ESTIMATOR_REASON
    #: The adapter's own facts for the report's metadata (``dtype``, framework versions).
    metadata: Callable[[], dict[str, Any]] = dict
    #: The report's ``training`` section (batch sizes, recompute...), where the adapter has one.
    training_settings: Callable[[], dict[str, Any]] | None = None
    #: Tensor attributes that hold a parameter's gradient (Megatron adds ``main_grad``).
    grad_attributes: tuple[str, ...] = ("grad",)
    #: This rank's dashboard writers for the job's step peaks, found at start.
    dashboard_sink: Callable[[], Sink | None] | None = None

    def estimate(self) -> StaticEstimate:
        """The static estimate, or why there is none."""
        return resolve_static_estimate(self.static_estimate, self.no_estimate_reason)

    def training(self) -> dict[str, Any] | None:
        """The report's ``training`` section, or ``None``."""
        return self.training_settings() if self.training_settings is not None else None
