"""Test-only instrumentation of the tiny GPT worker (``memscope.demo.traced_training``).

Not part of the installed package. Imported as ``harness`` with ``tests/`` on ``sys.path``:
pytest puts it there (the tests are plain modules, no ``__init__.py``, like ``conftest`` and
``flagscale_trees``), processes started by ``memscope.demo.launcher.spawn`` inherit the
parent's ``sys.path``, and ``tools/`` scripts insert it themselves.

* :func:`instrumented_worker` -- ``traced_worker`` plus gradient / parameter digests, exact
  parameter and optimizer-state byte sums, the count of hooks left after ``finalize`` and
  optional fault injection into MemScope; returns an :class:`InstrumentedResult`.
* :class:`Instrumentation` -- the :class:`~memscope.demo.traced_training.TrainingObserver`
  doing that work.
* :func:`fault_targets` -- the one place that knows which runtime attributes a fault replaces.
"""

from .instrumented import (
    FAULTS,
    Instrumentation,
    InstrumentedResult,
    count_hooks,
    digest,
    fault_targets,
    instrumented_worker,
)

__all__ = [
    "FAULTS",
    "Instrumentation",
    "InstrumentedResult",
    "count_hooks",
    "digest",
    "fault_targets",
    "instrumented_worker",
]
