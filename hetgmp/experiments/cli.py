"""``hetgmp experiment store-rate|staleness|partition``: the sweeps of :mod:`hetgmp.experiments`.

The same entry points back the thin scripts in ``examples/experiments/``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hetgmp.experiments.sweep import (
    DEFAULT_BOUNDS,
    DEFAULT_PARTS,
    DEFAULT_STORE_RATES,
    add_common_arguments,
    check_grid,
    options_from,
)

# (--help's description: plain text, no Sphinx markup)
DESCRIPTION = (
    "The sweeps of the paper's experiments: store-rate (mirrors), staleness (bound) and "
    "partition (methods, predicted vs measured). Each writes a CSV, PNG plots and a markdown "
    "table under --out, and resumes where it stopped. The scripts in examples/experiments/ "
    "are the same commands."
)


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from err


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from err


def _finish(errors: list[str], csv: Path) -> int:
    print(f"results: {csv} (+ .png, .md next to it)")
    if errors:
        print(
            f"{len(errors)} run(s) failed; rerun the same command to retry them:", file=sys.stderr
        )
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        return 1
    return 0


def handle_store_rate(args: argparse.Namespace) -> int:
    from hetgmp.experiments.store_rate import run_store_rate

    opts = options_from(args)
    check_grid(opts, store_rate=args.store_rates, bound=(args.bound,))
    errors, csv = run_store_rate(
        opts, store_rates=args.store_rates, bound=args.bound, plan=args.plan
    )
    return _finish(errors, csv)


def handle_staleness(args: argparse.Namespace) -> int:
    from hetgmp.experiments.staleness import run_staleness

    opts = options_from(args)
    check_grid(opts, bound=args.bounds, store_rate=(args.store_rate,))
    errors, csv = run_staleness(
        opts, bounds=args.bounds, store_rate=args.store_rate, plan=args.plan
    )
    return _finish(errors, csv)


def handle_partition(args: argparse.Namespace) -> int:
    from hetgmp.experiments.partition_compare import run_partition_compare
    from hetgmp.partition.api import METHODS

    opts = options_from(args)
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown or any(p < 1 for p in args.parts):
        raise ValueError(
            f"--methods must be among {','.join(METHODS)} (got {','.join(args.methods)}) and "
            f"--parts >= 1 (got {list(args.parts)})"
        )
    errors, csv = run_partition_compare(opts, methods=args.methods, parts=args.parts)
    return _finish(errors, csv)


def add_store_rate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("store-rate", help="sweep --store_rate (bytes/sample, AUC, memory)")
    add_common_arguments(p)
    p.add_argument(
        "--store-rates",
        type=_floats,
        default=DEFAULT_STORE_RATES,
        help="comma-separated store rates (default: %(default)s)",
    )
    p.add_argument("--bound", type=int, default=100, help="staleness bound of every run")
    p.add_argument(
        "--plan",
        type=Path,
        default=None,
        help="plan file (default: metis+refine at the run's batch size, made once)",
    )
    p.set_defaults(func=handle_store_rate)


def add_staleness(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("staleness", help="sweep --bound (AUC over samples seen)")
    add_common_arguments(p, eval_every=10)
    p.add_argument(
        "--bounds",
        type=_ints,
        default=DEFAULT_BOUNDS,
        help="comma-separated bounds (default: %(default)s)",
    )
    p.add_argument("--store-rate", type=float, default=0.01, help="store rate of every run")
    p.add_argument(
        "--plan",
        type=Path,
        default=None,
        help="plan file (default: metis+refine at the run's batch size, made once)",
    )
    p.set_defaults(func=handle_staleness)


def add_partition(sub: argparse._SubParsersAction) -> None:
    from hetgmp.partition.api import METHODS

    p = sub.add_parser("partition", help="compare partition methods: predicted vs measured")
    add_common_arguments(p)
    p.add_argument(
        "--methods",
        type=lambda t: tuple(x for x in t.split(",") if x),
        default=METHODS,
        help="comma-separated methods (default: all)",
    )
    p.add_argument(
        "--parts",
        type=_ints,
        default=DEFAULT_PARTS,
        help="comma-separated part (= rank) counts (default: %(default)s)",
    )
    p.set_defaults(func=handle_partition)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``hetgmp experiment ...`` to the ``hetgmp`` command."""
    top = sub.add_parser(
        "experiment", help="store-rate / staleness / partition sweeps", description=DESCRIPTION
    )
    exp = top.add_subparsers(dest="experiment", metavar="<experiment>", required=True)
    add_store_rate(exp)
    add_staleness(exp)
    add_partition(exp)


def main(name: str, argv: Sequence[str] | None = None) -> int:
    """Entry of ``examples/experiments/<name>.py``: ``hetgmp experiment <name> ...``."""
    from hetgmp.cli import main as hetgmp_main

    return hetgmp_main(["experiment", name, *(sys.argv[1:] if argv is None else argv)])
