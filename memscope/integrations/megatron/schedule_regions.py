"""Names for what Megatron's pipeline schedules allocate outside every module.

Between module forwards the schedule allocates memory of its own: ``forward_step``
(megatron/core/pipeline_parallel/schedules.py) loads the microbatch (the user's
``get_batch``) before the model's forward and computes the loss (``loss_func``) after it,
and ``P2PCommunicator._communicate`` (megatron/core/pipeline_parallel/p2p_communication.py)
allocates the buffers that receive the previous stage's activations and the next stage's
gradients. While MemScope traces, both are wrapped as training-loop regions of the tracer
(:meth:`~memscope.capture.tracer.MemoryTracer.enter_region`), so the peak composition and
the allocator history name them (:data:`FORWARD_STEP`, :data:`PIPELINE_P2P`) instead of
"no module". Feature-detected (what the installed Megatron lacks is left alone) and removed
at stop; a wrapper whose region bookkeeping fails calls the original from then on.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from memscope.capture.safety import FailureLog
from memscope.capture.tracer import MemoryTracer
from memscope.session import TracingSession

FORWARD_STEP = "(forward_step)"
PIPELINE_P2P = "(pipeline p2p)"

#: (module, attribute path, region): what is wrapped.
TARGETS = (
    ("megatron.core.pipeline_parallel.schedules", ("forward_step",), FORWARD_STEP),
    (
        "megatron.core.pipeline_parallel.p2p_communication",
        ("P2PCommunicator", "_communicate"),
        PIPELINE_P2P,
    ),
)


class ScheduleRegions:
    """Wraps Megatron's schedule functions as tracer regions while installed."""

    def __init__(self, tracer: MemoryTracer, failures: FailureLog) -> None:
        self.tracer, self.failures = tracer, failures
        self.enabled = True
        self._installed: list[tuple[Any, str, Any, Any]] = []  # owner, name, original, wrapper

    def install(self) -> list[str]:
        """Wrap every target the installed Megatron has; returns their names."""
        for module_name, path, region in TARGETS:
            try:
                owner: Any = importlib.import_module(module_name)
            except ImportError:
                continue
            for name in path[:-1]:
                owner = getattr(owner, name, None)
            original = getattr(owner, path[-1], None) if owner is not None else None
            if not callable(original):
                continue
            wrapper = self._wrap(original, region)
            setattr(owner, path[-1], wrapper)
            self._installed.append((owner, path[-1], original, wrapper))
        return [f"{getattr(o, '__name__', o)}.{n}" for o, n, _, _ in self._installed]

    def remove(self) -> None:
        """Put the originals back (where nobody wrapped them again after us)."""
        self.enabled = False
        for owner, name, original, wrapper in reversed(self._installed):
            if owner.__dict__.get(name) is wrapper:
                setattr(owner, name, original)
        self._installed.clear()

    def _wrap(self, original: Callable[..., Any], region: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def in_region(*args: Any, **kwargs: Any) -> Any:
            if not self.enabled:
                return original(*args, **kwargs)
            try:
                previous = self.tracer.enter_region(region)
            except Exception as exc:
                self._failed(exc)
                return original(*args, **kwargs)
            try:
                result = original(*args, **kwargs)
            except BaseException:
                self._exit(previous, raised=True)
                raise
            self._exit(previous, raised=False)
            return result

        return in_region

    def _exit(self, previous: str, raised: bool) -> None:
        try:
            self.tracer.exit_region(previous, raised)
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        self.enabled = False
        self.failures.record("schedule_regions", exc)


def install_schedule_regions(session: TracingSession) -> None:
    """While ``session`` traces module forwards, name what the schedule allocates outside
    them; removed when tracing stops. A failure is recorded once and tracing goes on."""
    tracer = session.tracer
    if tracer is None or not session.active or not session.config.hook_modules:
        return
    regions = ScheduleRegions(tracer, session.failures)
    session.on_stop("schedule_regions", regions.remove)
    try:
        regions.install()
    except Exception as exc:
        regions.remove()
        session.failures.record("schedule_regions", exc)
