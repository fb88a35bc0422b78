"""The arguments and helpers every ``hetgmp preprocess <format>`` shares: the common options
(split, vocabulary, reading, output), the :class:`PreprocessOptions` they give, the summary
line and the logging wrapper. In a module of their own because both
:mod:`hetgmp.data.preprocess_cli` (the generic formats) and :mod:`hetgmp.data.sample_cli` (the
two real samples) use them, and neither should import the other.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hetgmp.data.bad_lines import ON_BAD_LINE_CHOICES
from hetgmp.data.delimited import DEFAULT_BLOCK_BYTES
from hetgmp.data.preprocess_options import SPLIT_MODES, PreprocessOptions
from hetgmp.data.preprocess_vocab import add_vocab_args
from hetgmp.data.vocab import ID_ORDERS
from hetgmp.fmt import key_values
from hetgmp.progress import log_above_bars

if TYPE_CHECKING:
    from hetgmp.data.format import Dataset


def common_args(p: argparse.ArgumentParser, *, split: bool = True, test_file: bool = True) -> None:
    """The options every format but movielens shares (in ``--help`` order)."""
    p.add_argument("--out", type=Path, required=True, help="output dataset directory")
    p.add_argument(
        "--min-count",
        type=int,
        default=1,
        help="values seen fewer times share the field's rare id (default: 1)",
    )
    p.add_argument(
        "--id-order",
        choices=ID_ORDERS,
        default="frequency",
        help="order of ids within a field (default: frequency)",
    )
    add_vocab_args(p)
    _split_args(p, split=split, test_file=test_file)
    _reading_args(p)


def _split_args(p: argparse.ArgumentParser, *, split: bool, test_file: bool) -> None:
    """How rows are divided into train and test."""
    if split:
        p.add_argument(
            "--test-fraction",
            type=float,
            default=0.1,
            help="share of rows in test; 0 = no test split (default: 0.1)",
        )
        p.add_argument(
            "--split",
            choices=SPLIT_MODES,
            default="tail",
            help="tail: last rows are test (time order); random: hashed line "
            "number (default: tail)",
        )
        p.add_argument("--seed", type=int, default=0, help="seed of --split random (default: 0)")
    if test_file:
        p.add_argument(
            "--test-file",
            type=Path,
            nargs="+",
            default=None,
            help="files whose rows form the test split (overrides --test-fraction)",
        )


def _reading_args(p: argparse.ArgumentParser) -> None:
    """Bad lines, block size, progress and overwriting."""
    p.add_argument(
        "--on-bad-line",
        choices=ON_BAD_LINE_CHOICES,
        default="error",
        help="error: stop at the first bad line (file:line in the message); "
        "skip: drop and count them in meta.json source.bad_lines",
    )
    p.add_argument(
        "--block-bytes",
        type=int,
        default=DEFAULT_BLOCK_BYTES,
        help=f"bytes read per block (default: {DEFAULT_BLOCK_BYTES})",
    )
    output_args(p)


def output_args(p: argparse.ArgumentParser) -> None:
    """Progress and overwriting (every format, movielens too)."""
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="progress bar on a terminal (default: on)",
    )
    p.add_argument(
        "--overwrite",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="replace an existing --out directory (default: off)",
    )


def preprocess_options(args: argparse.Namespace, name: str) -> PreprocessOptions:
    """The options the common arguments give, for a data set called ``name``."""
    return PreprocessOptions(
        min_count=args.min_count,
        id_order=args.id_order,
        test_fraction=getattr(args, "test_fraction", 0.0),
        split=getattr(args, "split", "tail"),
        seed=getattr(args, "seed", 0),
        on_bad_line=args.on_bad_line,
        progress=args.progress,
        name=name,
        overwrite=args.overwrite,
        reserve_rare_id=args.reserve_rare_id,
        vocab_from=args.vocab_from,
        grow_vocab=getattr(args, "grow_vocab", False),
    )


def report_done(ds: Dataset) -> int:
    """Print what was written (one line) and return the exit status 0."""
    m = ds.meta
    bad = m.source.get("bad_lines", {}).get("skipped", 0)
    print(
        f"wrote {ds.root}: {m.num_fields} fields"
        + (f" + {len(m.multi_hot)} multi-hot" if m.multi_hot else "")
        + f", {m.num_embeddings} rows, "
        f"{m.num_dense} dense, splits {key_values(m.splits)}, skipped bad lines {bad}, "
        f"fingerprint {m.fingerprint[:12]}"
    )
    return 0


def with_logging(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``fn(args)`` with log lines on stderr, drawn above any progress bar."""

    def run(args: argparse.Namespace) -> int:
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
        with log_above_bars():  # (pass lines while a bar is drawn)
            return fn(args)

    return run
