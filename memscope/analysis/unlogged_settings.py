"""Settings a Megatron-LM log cannot show that change the memory it printed.

An arguments block or a launch command names every flag, but some of what runs depends on
the environment instead: which Adam Megatron-LM imports (megatron/core/optimizer/__init__.py
tries Transformer Engine's ``FusedAdam``, then Apex's, and falls back to
``torch.optim.AdamW`` with a Python warning only). ``memscope analyze-log`` estimates the
printed configuration as Megatron's defaults would run it; when a measurement lies outside
the estimator's band, each alternative here is estimated too, and one that brings it within
the band is named beside the verdict (``log_check.explained_if``), never silently taken.

Which megatron-core ran the log is one such setting too: an arguments block dates a run only
to a range of releases (``megatron_versions.release_range``); the spec follows the newest,
and each older release whose terms differ is an alternative (:func:`older_release`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from memscope.analysis.static.config import TrainingSpec


@dataclass(frozen=True)
class UnloggedSetting:
    """One such setting: its name, why the log cannot tell, and the spec with it (None
    where it does not apply to the spec)."""

    name: str
    why: str
    apply: Callable[[TrainingSpec], TrainingSpec | None]


def _torch_adamw(spec: TrainingSpec) -> TrainingSpec | None:
    prec = spec.precision
    if prec.optimizer != "adam" or prec.torch_optimizer:
        return None
    return dataclasses.replace(spec, precision=dataclasses.replace(prec, torch_optimizer=True))


UNLOGGED_SETTINGS: tuple[UnloggedSetting, ...] = (
    UnloggedSetting(
        "torch's AdamW",
        "neither Transformer Engine's nor Apex's FusedAdam imported (Megatron says so in a "
        "Python warning only); its foreach step holds one fp32 copy of a parameter group",
        _torch_adamw,
    ),
)


def older_release(version: str, spec_there: TrainingSpec, dated: str) -> UnloggedSetting:
    """An older release a dated arguments block can come from (``dated``: the range, as
    ``0.8 to 0.14``), whose terms differ from the newest's, with the spec read there (its
    checks and layout as that release has them). Its ``apply`` returns that spec whatever
    it is handed: it belongs to the one run whose block was read twice."""
    return UnloggedSetting(
        f"megatron-core {version}",
        f"the arguments block dates the run to megatron-core {dated} only; the estimate "
        "follows the newest of them that accepts the run",
        lambda spec: spec_there,
    )
