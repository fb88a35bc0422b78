"""``hetgmp train`` and ``examples/hetuctr.py``: one set of options (:class:`TrainConfig`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hetgmp.config import add_arguments, from_namespace
from hetgmp.config_file import add_config_option
from hetgmp.train.config import TrainConfig

DESCRIPTION = (
    "Train a CTR model (WDL, DCN, DeepFM, DLRM) with a partitioned, mirrored, bounded-staleness "
    "embedding table. Launch under mpirun -np N, torchrun --nproc_per_node N, or as one process."
)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The training options, shared by every entry point."""
    add_config_option(parser)
    add_arguments(parser, TrainConfig)


def handle(args: argparse.Namespace) -> int:
    from hetgmp.train.run import run

    cfg = from_namespace(TrainConfig, args)
    run(cfg)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``hetgmp train`` to the ``hetgmp`` command."""
    p = sub.add_parser("train", help="train a CTR model", description=DESCRIPTION)
    add_train_arguments(p)
    p.set_defaults(func=handle)


def main(argv: Sequence[str] | None = None) -> int:
    """``examples/hetuctr.py``: the same as ``hetgmp train``, with the same error handling."""
    from hetgmp.cli import main as hetgmp_main

    return hetgmp_main(["train", *(sys.argv[1:] if argv is None else argv)])
