"""hetgmp preprocess <format> ...: turn raw click logs into a dataset directory.

Formats: criteo (Kaggle train.txt / day_N TSV), csv (any delimited file with a column spec),
libsvm (libsvm/libfm lines: label field:id:value), parquet, and the two real samples
criteo-sample and movielens. All go through the same two-pass, bounded-memory pipeline
(hetgmp.data.preprocess) and the same vocabulary rules (hetgmp.data.vocab).
"""

# (the docstring is the command's --help description: plain text, no Sphinx markup)

from __future__ import annotations

import argparse
from pathlib import Path

from hetgmp.data.delimited import DENSE_TRANSFORMS, DelimitedSource, criteo_spec, resolve_columns
from hetgmp.data.delimited_lists import parse_multi_hot_arg
from hetgmp.data.libsvm_fields import LIBSVM_HELP
from hetgmp.data.preprocess import preprocess
from hetgmp.data.preprocess_args import common_args, preprocess_options, report_done, with_logging
from hetgmp.data.sample_cli import add_criteo_sample, add_movielens


def _run_criteo(args: argparse.Namespace) -> int:
    spec = criteo_spec()
    src = DelimitedSource(args.inputs, spec, block_bytes=args.block_bytes, kind="criteo-tsv")
    test = (
        DelimitedSource(args.test_file, spec, block_bytes=args.block_bytes, kind="criteo-tsv")
        if args.test_file
        else None
    )
    return report_done(
        preprocess(src, args.out, preprocess_options(args, "criteo"), test_source=test)
    )


def _inputs_after_column_lists(args: argparse.Namespace) -> None:
    """``--categorical a b data.csv`` gives the option's ``nargs`` the file too: existing files
    at the end of a column list (columns are names or indices, not paths) are moved back to
    the inputs, in their order."""
    for name in ("categorical", "dense"):
        values = getattr(args, name)
        while values and Path(values[-1]).is_file():
            args.inputs.insert(0, Path(values.pop()))
    if not args.inputs:
        raise ValueError("no input files given (name them before or after the column options)")
    if not args.categorical:
        raise ValueError("--categorical needs at least one column")


def _run_csv(args: argparse.Namespace) -> int:
    _inputs_after_column_lists(args)
    quote = args.quote_char or None
    spec = resolve_columns(
        args.inputs[0],
        label=args.label,
        dense=args.dense,
        categorical=args.categorical,
        delimiter=args.delimiter.replace("\\t", "\t"),
        header=args.header,
        quote_char=quote,
        dense_kind="float",
        categorical_kind="string",
        dense_transform=args.dense_transform,
        multi_hot=[parse_multi_hot_arg(m) for m in args.multi_hot],
    )
    src = DelimitedSource(args.inputs, spec, block_bytes=args.block_bytes, kind="csv")
    test = (
        DelimitedSource(args.test_file, spec, block_bytes=args.block_bytes, kind="csv")
        if args.test_file
        else None
    )
    return report_done(
        preprocess(src, args.out, preprocess_options(args, args.inputs[0].stem), test_source=test)
    )


def _run_libsvm(args: argparse.Namespace) -> int:
    from hetgmp.data.libsvm import LibsvmSource

    src = LibsvmSource(
        args.inputs,
        num_fields=args.num_fields,
        dense_fields=args.dense_fields,
        dense_transform=args.dense_transform,
        block_bytes=args.block_bytes,
        field_map=args.field_map,
        multi_hot_fields=args.multi_hot_fields,
    )
    test = None
    if args.test_file:
        # the same fields and line form as the training files
        test = LibsvmSource(
            args.test_file,
            num_fields=src.num_fields,
            dense_fields=args.dense_fields,
            dense_transform=args.dense_transform,
            block_bytes=args.block_bytes,
            field_map=src.field_map,
            form=src.form,
            multi_hot_fields=args.multi_hot_fields,
        )
    return report_done(
        preprocess(src, args.out, preprocess_options(args, args.inputs[0].stem), test_source=test)
    )


def _run_parquet(args: argparse.Namespace) -> int:
    from hetgmp.data.parquet_reader import ParquetSource

    _inputs_after_column_lists(args)

    def make(paths: list[Path]) -> ParquetSource:
        return ParquetSource(
            paths,
            label=args.label,
            dense=args.dense,
            categorical=args.categorical,
            dense_transform=args.dense_transform,
            multi_hot=args.multi_hot,
        )

    src = make(args.inputs)
    test = make(args.test_file) if args.test_file else None
    return report_done(
        preprocess(src, args.out, preprocess_options(args, args.inputs[0].stem), test_source=test)
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``hetgmp preprocess <format>`` to ``hetgmp``."""
    top = sub.add_parser(
        "preprocess",
        help="convert raw click logs into a dataset directory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    fmt = top.add_subparsers(dest="format", metavar="<format>", required=True)
    # The order here is the order ``hetgmp preprocess --help`` lists the formats in.
    for add in (
        _add_criteo,
        _add_csv,
        _add_libsvm,
        _add_parquet,
        add_criteo_sample,
        add_movielens,
    ):
        add(fmt)


def _add_criteo(fmt: argparse._SubParsersAction) -> None:
    p = fmt.add_parser(
        "criteo",
        help="Criteo TSV (Kaggle train.txt, 1 TB day_N)",
        description="Criteo TSV: label, I1..I13 (ints), C1..C26 (hex), tab separated, empty "
        "fields allowed. Dense: missing -> 0, y = log(max(x, 0) + 2). Categorical: "
        "hex parsed exactly; missing is one more value; values below --min-count "
        "share one rare id per field.",
    )
    p.add_argument("inputs", type=Path, nargs="+", help="TSV files (read as one stream)")
    common_args(p)
    p.set_defaults(func=with_logging(_run_criteo))


def _add_csv(fmt: argparse._SubParsersAction) -> None:
    p = fmt.add_parser(
        "csv",
        help="delimited text with a column spec",
        description="Generic delimited file. Columns by header name (with --header) or 0-based "
        "index. Categorical values are hashed (64-bit FNV-1a); empty = missing.",
    )
    _columns(p)
    p.add_argument("--delimiter", default=",", help="one character; '\\t' for tab (default: ,)")
    p.add_argument(
        "--header",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first line of each file is a header (default: on)",
    )
    p.add_argument("--quote-char", default="", help="quote character (default: none)")
    p.add_argument(
        "--multi-hot",
        action="append",
        default=[],
        metavar="COL[:SEP]",
        help="a multi-hot column: each cell a list of values split by SEP (default: |), an "
        "empty cell an empty list; repeat for several (issue 34)",
    )
    _dense_transform(p)
    common_args(p)
    p.set_defaults(func=with_logging(_run_csv))


def _columns(p: argparse.ArgumentParser) -> None:
    """The inputs and the column spec of csv and parquet."""
    p.add_argument("inputs", type=Path, nargs="*", help="files (before or after the options)")
    p.add_argument("--label", required=True, help="label column (values 0/1)")
    p.add_argument("--dense", nargs="*", default=[], help="dense (numeric) columns")
    p.add_argument("--categorical", nargs="+", required=True, help="categorical columns")


def _dense_transform(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dense-transform",
        choices=DENSE_TRANSFORMS,
        default="none",
        help="dense values as they are (none) or log(max(x, 0) + 2) (log) (default: none)",
    )


def _add_libsvm(fmt: argparse._SubParsersAction) -> None:
    p = fmt.add_parser(
        "libsvm",
        help="libsvm (label index:value) or libfm (label field:id:value) lines",
        description=LIBSVM_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("inputs", type=Path, nargs="+", help="libsvm / libfm files (one stream)")
    p.add_argument(
        "--num-fields",
        type=int,
        default=None,
        help="number of fields (default: 1 + the largest field: one extra scan of the input; "
        "with --field-map, 1 + its largest field)",
    )
    p.add_argument(
        "--field-map",
        type=Path,
        default=None,
        metavar="FILE",
        help="plain libsvm lines: map feature index -> field ('index field' lines) instead "
        "of taking the token's position as its field",
    )
    p.add_argument(
        "--dense-fields",
        type=int,
        nargs="*",
        default=[],
        help="field indices whose value is a dense feature",
    )
    p.add_argument(
        "--multi-hot-fields",
        type=int,
        nargs="*",
        default=[],
        help="field indices that may repeat on a line: the field's tokens form a bag (libfm "
        "lines or --field-map; a line without the field has an empty bag) (issue 34)",
    )
    _dense_transform(p)
    common_args(p)
    p.set_defaults(func=with_logging(_run_libsvm))


def _add_parquet(fmt: argparse._SubParsersAction) -> None:
    p = fmt.add_parser("parquet", help="parquet files (row groups streamed)")
    _columns(p)
    p.add_argument(
        "--multi-hot",
        action="append",
        default=[],
        metavar="COL",
        help="a multi-hot column: a list column (list<int> or list<string>), one bag per row, "
        "a null list an empty bag; repeat for several (issue 34)",
    )
    _dense_transform(p)
    common_args(p)
    p.set_defaults(func=with_logging(_run_parquet))
