"""``hetgmp predict``: score raw files with a serving artifact, streaming, into parquet.

Files are read block by block by the reader that made the artifact's vocabulary (the same
parsing, validation and bad-line rules as ``hetgmp preprocess``), encoded with the vocabulary (a
multi-hot field's lists value by value, pooled as training pooled them), scored in batches and
appended to the output, so memory stays bounded by a block. Every output row carries its input
file and line number (the ``file`` and ``line`` columns), so scores join back to the input;
``label`` is written when the input has labels.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from hetgmp.data.bad_lines import BadLineReport
from hetgmp.data.delimited import DelimitedSource, DelimitedSpec
from hetgmp.data.delimited_spec import read_first_line
from hetgmp.progress import auto_unless_off, bar_wanted
from hetgmp.serve.artifact import ArtifactError
from hetgmp.serve.bags import slice_bags
from hetgmp.serve.scorer import Scorer, load

FORMATS = ("criteo", "csv", "libsvm", "parquet")
LABEL_MODES = ("auto", "yes", "no")


@dataclasses.dataclass
class PredictOptions:
    """What ``hetgmp predict`` was asked for."""

    fmt: str | None = None  # None: the vocabulary's reader
    label: str = "auto"  # yes / no / auto (criteo: by column count; others: yes)
    on_bad_line: str = "error"
    batch_size: int = 65536
    block_bytes: int | None = None
    device: str = "cpu"
    compile: Any = "auto"  # hetgmp.serve.load's: "auto" (on CUDA), True, False
    progress: bool = True
    trust_program: bool = False  # hetgmp.serve.load's: unpickle dense.pt2 (it can run code)


def _format_of(record: dict[str, Any]) -> str:
    reader = record.get("reader")
    if reader == "delimited":
        return "criteo" if record.get("kind") == "criteo-tsv" else "csv"
    return str(reader)


def unlabeled_spec(spec: DelimitedSpec) -> DelimitedSpec:
    """The same columns without the label column (indices after it move down by one)."""
    assert spec.label is not None
    lab = spec.label

    def move(c: int) -> int:
        return c - 1 if c > lab else c

    return dataclasses.replace(
        spec,
        num_columns=spec.num_columns - 1,
        label=None,
        dense=[move(c) for c in spec.dense],
        categorical=[move(c) for c in spec.categorical],
        multi_hot=[move(c) for c in spec.multi_hot],
        column_names=[n for i, n in enumerate(spec.column_names) if i != lab],
    )


def _has_label(spec: DelimitedSpec, first: Path, mode: str, fmt: str) -> bool:
    if mode != "auto":
        return mode == "yes"
    if fmt != "criteo":
        return True
    # Criteo's test files are the training columns without the label: 39 tab-separated
    # columns instead of 40.
    cols = read_first_line(first).rstrip(b"\r\n").count(spec.delimiter.encode()) + 1
    return cols != spec.num_columns - 1


def open_reader(scorer: Scorer, paths: list[Path], opts: PredictOptions) -> tuple[Any, bool]:
    """(reader of ``paths`` as the vocabulary's, whether rows carry labels)."""
    vocab = scorer.vocabulary
    record = vocab.manifest["input"]
    fmt = _format_of(record)
    if opts.fmt is not None and opts.fmt != fmt:
        raise ArtifactError(
            f"{vocab.manifest_path}: the model's data was read as {fmt}, not --format {opts.fmt}"
        )
    kw = {} if opts.block_bytes is None else {"block_bytes": opts.block_bytes}
    if record.get("reader") == "delimited":
        spec = DelimitedSpec(**record["spec"])
        labeled = _has_label(spec, paths[0], opts.label, fmt)
        if not labeled:
            spec = unlabeled_spec(spec)
        source = DelimitedSource(list(paths), spec, kind=record.get("kind", "delimited"), **kw)
    else:
        if opts.label == "no":
            raise ValueError(f"--no-label: label-less {fmt} input is not supported (criteo, csv)")
        source, labeled = vocab.make_source(paths, **kw), True
    vocab.check_source(source)
    return source, labeled


def _scores(scorer: Scorer, ids: np.ndarray, dense: Any, bags: list[Any], batch: int) -> np.ndarray:
    """Scores of a block's rows in batches of ``batch`` (``bags``: its multi-hot fields')."""
    out = np.empty(ids.shape[0], np.float32)
    for s in range(0, ids.shape[0], batch):
        e = min(s + batch, ids.shape[0])
        d = None if dense is None else torch.from_numpy(np.ascontiguousarray(dense[s:e]))
        part = [(torch.from_numpy(v), torch.from_numpy(o)) for v, o in slice_bags(bags, s, e)]
        p = scorer.score(torch.from_numpy(ids[s:e]), d, bags=part or None, check=False)
        out[s:e] = p.cpu().numpy()
    return out


def predict_files(
    model_dir: Path, paths: list[Path], out: Path, opts: PredictOptions | None = None
) -> dict[str, Any]:
    """Score ``paths`` into the parquet file ``out``; returns a summary (rows, bad lines)."""
    opts = opts or PredictOptions()
    if opts.batch_size < 1:
        raise ValueError(f"--batch-size must be positive, got {opts.batch_size}")
    out = Path(out)
    if not out.parent.is_dir():  # (a mistyped path must not grow new directories)
        raise FileNotFoundError(
            f"--out {out}: directory {out.parent} does not exist; create it first"
        )
    scorer = load(
        model_dir, device=opts.device, compile=opts.compile, trust_program=opts.trust_program
    )
    source, labeled = open_reader(scorer, [Path(p) for p in paths], opts)
    report = BadLineReport(opts.on_bad_line, unit=getattr(source, "unit", "line"))
    fields = [("file", pa.string()), ("line", pa.int64()), ("score", pa.float32())]
    schema = pa.schema(fields + ([("label", pa.float32())] if labeled else []))
    tmp = out.with_name(f".{out.name}.tmp")
    bar = tqdm(
        total=source.total_bytes,
        unit="B",
        unit_scale=True,
        desc="predict",
        disable=not bar_wanted(auto_unless_off(opts.progress)),
    )
    rows = 0
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            for block in source.iter_blocks(report, bar.update):
                ids = scorer.vocabulary.encode_block(block)
                bags = scorer.vocabulary.encode_lists(block)  # (multi-hot fields' bags)
                scores = _scores(scorer, ids, block.dense, bags, opts.batch_size)
                cols = [
                    pa.array([block.path] * len(block), pa.string()),
                    pa.array(block.lines, pa.int64()),
                    pa.array(scores, pa.float32()),
                ]
                if labeled:
                    cols.append(pa.array(block.labels, pa.float32()))
                writer.write_table(pa.Table.from_arrays(cols, schema=schema))
                rows += len(block)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        bar.close()
    os.replace(tmp, out)
    return {"out": str(out), "rows": rows, "labels": labeled, "bad_lines": report.to_dict()}
