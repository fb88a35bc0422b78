"""``hetgmp preprocess criteo-sample`` and ``movielens``: the two real samples, each with its
fixed layout (the other formats are in :mod:`hetgmp.data.preprocess_cli`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hetgmp.data.preprocess_args import (
    common_args,
    output_args,
    preprocess_options,
    report_done,
    with_logging,
)
from hetgmp.data.vocab import ID_ORDERS

DEFAULT_SHARED = Path("../shared/datasets")


def _run_criteo_sample(args: argparse.Namespace) -> int:
    from hetgmp.data.criteo_sample import convert_criteo_sample

    return report_done(
        convert_criteo_sample(
            args.src,
            args.out,
            reference=args.hetgmp_reference,
            options=preprocess_options(args, "criteo-sample"),
        )
    )


def _run_movielens(args: argparse.Namespace) -> int:
    from hetgmp.data.movielens import convert_movielens

    return report_done(
        convert_movielens(
            args.src,
            args.out,
            test_fraction=args.test_fraction,
            seed=args.seed,
            id_order=args.id_order,
            overwrite=args.overwrite,
            multi_hot_genres=args.multi_hot_genres,
        )
    )


def add_criteo_sample(fmt: argparse._SubParsersAction) -> None:
    """``hetgmp preprocess criteo-sample``."""
    p = fmt.add_parser(
        "criteo-sample",
        help="the real 8000-row Criteo sample",
        description="train.csv -> train, dev.csv + test.csv -> test. With --hetgmp-reference: "
        "all 8000 rows as train, ids by first appearance, --min-count 1 (the "
        "encoding HET-GMP's reference numbers assume; 37,100 rows).",
    )
    p.add_argument(
        "src",
        type=Path,
        nargs="?",
        default=DEFAULT_SHARED / "criteo-sample",
        help="directory with train.csv, dev.csv, test.csv (default: %(default)s)",
    )
    p.add_argument(
        "--hetgmp-reference",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="HET-GMP's reference encoding (see above) (default: off)",
    )
    common_args(p, split=False, test_file=False)
    p.set_defaults(func=with_logging(_run_criteo_sample))


def add_movielens(fmt: argparse._SubParsersAction) -> None:
    """``hetgmp preprocess movielens``."""
    p = fmt.add_parser(
        "movielens",
        help="MovieLens 100K as clicks (rating >= 4)",
        description="7 fields: user, item, age_bucket, gender, occupation, zip_prefix, "
        "primary_genre; ids by first appearance in u.data (default).",
    )
    p.add_argument(
        "src",
        type=Path,
        nargs="?",
        default=DEFAULT_SHARED / "movielens-100k",
        help="the ml-100k directory (u.data, u.user, u.item) (default: %(default)s)",
    )
    p.add_argument("--out", type=Path, required=True, help="output dataset directory")
    p.add_argument(
        "--test-fraction",
        type=float,
        default=0.1,
        help="share of ratings in test, by hashed line number (default: 0.1)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the split (default: 0)")
    p.add_argument(
        "--id-order",
        choices=ID_ORDERS,
        default="first-appearance",
        help="order of ids within a field (default: first-appearance)",
    )
    p.add_argument(
        "--multi-hot-genres",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="add 'genres', a multi-hot field of every genre flagged for the rated item "
        "(issue 34; the data set is then format version 2) (default: off)",
    )
    output_args(p)  # (100K ratings are read at once: no bar to show, but the same flags)
    p.set_defaults(func=with_logging(_run_movielens))
