"""The world-size options shared by ``analyze-static`` and ``plan``, and their reading.

``--world-size``, ``--nnodes`` x ``--nproc-per-node``, a FlagScale ``--experiment`` YAML or a
``--hostfile``: any of them, and those given must agree. A FlagScale experiment YAML given as
``--config`` gives the world size of its runner when none of them does; one that does
overrides it, with a warning when they differ.
"""

from __future__ import annotations

import argparse
from typing import Any

from memscope.cli.common import CliError, progress


def add_world_size_args(parser: Any) -> None:
    """Add the world-size options to ``parser``."""
    world = parser.add_argument_group(
        "world size (else the config's world_size / data_parallel_size)"
    )
    world.add_argument("--world-size", type=int, default=None, help="number of ranks")
    world.add_argument("--nnodes", type=int, default=None, help="nodes (with --nproc-per-node)")
    world.add_argument(
        "--nproc-per-node", type=int, default=None, help="ranks per node (with --nnodes)"
    )
    world.add_argument(
        "--experiment",
        default=None,
        help="FlagScale experiment YAML: its runner's hostfile or nnodes x nproc_per_node",
    )
    world.add_argument("--hostfile", default=None, help="hostfile of 'host slots=N' lines")


def world_size_from_args(args: argparse.Namespace) -> tuple[int | None, str]:
    """The world size the options give (None: none does) and where it comes from; options
    that disagree are a one-line error."""
    from memscope.inputs.flagscale_experiment import experiment_world_size
    from memscope.inputs.hostfile import read_hostfile

    given: list[tuple[int, str]] = []
    if args.world_size is not None:
        if args.world_size < 1:
            raise CliError(f"--world-size must be >= 1, got {args.world_size}")
        given.append((args.world_size, "--world-size"))
    if (args.nnodes is None) != (args.nproc_per_node is None):
        raise CliError("--nnodes and --nproc-per-node go together")
    if args.nnodes is not None:
        if args.nnodes < 1 or args.nproc_per_node < 1:
            raise CliError("--nnodes and --nproc-per-node must be >= 1")
        what = f"--nnodes {args.nnodes} x --nproc-per-node {args.nproc_per_node}"
        given.append((args.nnodes * args.nproc_per_node, what))
    try:
        if args.hostfile is not None:
            given.append((read_hostfile(args.hostfile), f"hostfile {args.hostfile}"))
        if args.experiment is not None:
            found = experiment_world_size(args.experiment)
            if found is not None:
                given.append((found[0], f"{args.experiment}: {found[1]}"))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    for size, where in given[1:]:
        if size != given[0][0]:
            raise CliError(f"world size {size} ({where}) contradicts {given[0][0]} ({given[0][1]})")
    runner = _config_runner(getattr(args, "config", None))
    if runner is None:
        return (given[0][0], given[0][1]) if given else (None, "")
    if not given:
        return runner
    if given[0][0] != runner[0]:
        progress(
            f"warning: world size {given[0][0]} ({given[0][1]}) overrides {runner[0]} ({runner[1]})"
        )
    return given[0][0], given[0][1]


def _config_runner(config: str | None) -> tuple[int, str] | None:
    """The world size a FlagScale experiment YAML given as ``--config`` launches with (its
    ``experiment.runner``), and where from; ``None`` for any other config (one that cannot
    be read is left to the config loading to report) or a runner whose size is unknown
    before launch (said in a warning)."""
    from memscope.inputs.config_text import read_yaml
    from memscope.inputs.flagscale_experiment import runner_world_size

    if config is None or not config.lower().endswith((".yaml", ".yml")):
        return None
    try:
        data = read_yaml(config)
    except ValueError:
        return None
    try:
        found = runner_world_size(data, config)
    except ValueError as exc:  # e.g. nnodes: ${env:WORLD_SIZE}, known only at launch
        progress(f"warning: {config}: {exc}; its world size is not used")
        return None
    return None if found is None else (found[0], f"{config}: {found[1]}")
