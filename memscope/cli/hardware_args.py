"""What ``analyze-static``, ``plan`` and ``analyze-log`` read about the machine a run uses,
beyond its config or log: the GPU and Transformer Engine options, and the spec with the
hardware options applied."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec


def add_gpu_arg(parser: argparse.ArgumentParser) -> None:
    """Add ``--gpu`` to ``parser``."""
    parser.add_argument(
        "--gpu",
        default=None,
        help="the GPU (h100, a100, h200, b200, ...): sizes the fixed cuBLAS / Transformer "
        "Engine workspaces (default: an H100 is assumed and said so)",
    )


def add_transformer_engine_arg(parser: argparse.ArgumentParser) -> None:
    """Add ``--transformer-engine-version`` to ``parser``."""
    parser.add_argument(
        "--transformer-engine-version",
        default=None,
        metavar="VERSION",
        help="the run's Transformer Engine release (e.g. 2.14.0, or none): its GEMM workspaces "
        "and cached placeholder gradients depend on it (default: 2.17 is assumed and said so)",
    )


def with_hardware(spec: TrainingSpec, args: argparse.Namespace) -> TrainingSpec:
    """``spec`` with the command's ``--device``, ``--gpu``, ``--transformer-engine-version``
    and, where the command has it, ``--cublas-workspace-config``."""
    return replace(
        spec,
        device=args.device,
        gpu=args.gpu,
        transformer_engine_version=args.transformer_engine_version,
        cublas_workspace_config=getattr(
            args, "cublas_workspace_config", spec.cublas_workspace_config
        ),
    )
