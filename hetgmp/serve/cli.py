"""``hetgmp export`` and ``hetgmp predict``: from a checkpoint to scores on new raw data.

The handlers import torch; this module does not (``hetgmp --help`` stays fast).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from hetgmp.data.bad_lines import ON_BAD_LINE_CHOICES
from hetgmp.serve.artifact import DTYPES

_FORMATS = ("criteo", "csv", "libsvm", "parquet")  # (hetgmp.serve.predict.FORMATS)


def _logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")


def _run_export(args: argparse.Namespace) -> int:
    from hetgmp.serve.export import ExportOptions, export_checkpoint

    _logging()
    opts = ExportOptions(
        dtype=args.dtype, min_count=args.min_count, dataset=args.dataset, overwrite=args.overwrite
    )
    out = export_checkpoint(args.checkpoint, args.out, opts)
    m = json.loads((out / "manifest.json").read_text())
    onnx = m["onnx"]["file"] or f"none ({m['onnx']['note']})"
    bags = ", ".join(f"{f['name']} ({f['pooling']})" for f in m.get("multi_hot", []))
    print(
        f"wrote {out}: model {m['model']}, rows {m['rows']['shape']} {m['dtype']}, "
        f"vocabulary {'yes' if m['vocabulary'] else 'no'}, onnx {onnx}"
        + (f", multi-hot fields {bags}" if bags else "")
        + (f", field dims {','.join(map(str, m['field_dims']))}" if m.get("field_dims") else "")
    )
    return 0


def _run_predict(args: argparse.Namespace) -> int:
    from hetgmp.progress import log_above_bars
    from hetgmp.serve.predict import PredictOptions, predict_files

    _logging()
    opts = PredictOptions(
        fmt=args.format,
        label=args.label,
        on_bad_line=args.on_bad_line,
        batch_size=args.batch_size,
        device=args.device,
        compile={"auto": "auto", "on": True, "off": False}[args.compile],
        progress=args.progress,
        trust_program=args.trust_program,
    )
    with log_above_bars():
        res = predict_files(args.model_dir, args.inputs, args.out, opts)
    skipped = res["bad_lines"].get("skipped", 0)
    print(f"wrote {res['out']}: {res['rows']} rows scored, skipped bad lines {skipped}")
    return 0


def _export_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a serving artifact (dense program, rows, vocabulary) from a checkpoint",
        description="Export a checkpoint (written by any number of ranks) as a self-contained "
        "serving artifact: the dense part's weights in safetensors (and as a torch.export "
        "program), the rows by global id in safetensors, the vocabulary, the config and a manifest with checksums "
        "(docs/serving.md).",
    )
    p.add_argument("checkpoint", type=Path, help="checkpoint step directory, or its parent")
    p.add_argument("--out", type=Path, required=True, help="artifact directory to write")
    p.add_argument("--dtype", choices=DTYPES, default="fp32", help="rows' dtype (default: fp32)")
    p.add_argument(
        "--min-count",
        type=int,
        default=None,
        help="keep only rows accessed at least K times in training (others map to their "
        "field's rare-id row, else a zero row)",
    )
    p.add_argument(
        "--dataset",
        type=Path,
        default=None,
        help="the training data set (default: the checkpoint config's --dataset)",
    )
    p.add_argument(
        "--overwrite",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="replace an existing --out directory (default: off)",
    )
    p.set_defaults(func=_run_export)


def _predict_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="score raw files with an exported model into parquet",
        description="Score raw files (read and encoded as preprocessing read the training "
        "data) with a serving artifact; writes file, line, score (and label when present) "
        "per input row.",
    )
    p.add_argument("model_dir", type=Path, help="artifact written by hetgmp export")
    p.add_argument("inputs", type=Path, nargs="+", help="raw input files")
    p.add_argument(
        "--format", choices=_FORMATS, default=None, help="input format (default: the model's)"
    )
    p.add_argument("--out", type=Path, required=True, help="output parquet file")
    p.add_argument(
        "--label",
        choices=("auto", "yes", "no"),
        default="auto",
        help="whether rows start with a label (auto: criteo by column count, else yes)",
    )
    p.add_argument(
        "--on-bad-line",
        choices=ON_BAD_LINE_CHOICES,
        default="error",
        help="error: stop at the first bad line (file:line in the message); skip: drop it",
    )
    p.add_argument("--batch-size", type=int, default=65536, help="rows per forward pass")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument(
        "--compile",
        choices=("auto", "on", "off"),
        default="auto",
        help="torch.compile the scorer, with CUDA graphs on CUDA (auto: on CUDA); a failure "
        "stops with the reason (off: the dense part uncompiled)",
    )
    p.add_argument(
        "--trust-program",
        action="store_true",
        help="load the dense part from the exported program dense.pt2, which is unpickled and "
        "so can run code: only for artifacts from a trusted source, or made by a hetgmp older "
        "than dense.safetensors (default: the weights of dense.safetensors in this hetgmp's "
        "model code; nothing is unpickled)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="progress bar on a terminal (default: on)",
    )
    p.set_defaults(func=_run_predict)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``hetgmp export`` and ``hetgmp predict``."""
    _export_parser(sub)
    _predict_parser(sub)
