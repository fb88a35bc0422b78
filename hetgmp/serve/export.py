"""``hetgmp export``: a checkpoint (any rank count) -> a self-contained serving artifact.

The artifact's layout is described in :mod:`hetgmp.serve.artifact` and docs/serving.md. The
directory is built under a temporary name next to ``--out`` and renamed when complete, so a
failed export leaves nothing that looks like an artifact.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from hetgmp.choices import parse_pooling, pooling_ok
from hetgmp.data.dataset_meta import DatasetError
from hetgmp.data.format import open_dataset
from hetgmp.data.vocab_files import has_vocabulary, read_manifest
from hetgmp.models.field_dims import FieldDims
from hetgmp.serve.artifact import (
    CONFIG,
    DENSE,
    DTYPES,
    ONNX,
    PROGRAM,
    ROWS,
    VOCAB,
    ArtifactError,
    write_manifest,
)
from hetgmp.serve.program import (
    build_dense_program,
    export_onnx,
    export_program,
    save_dense_weights,
)
from hetgmp.serve.table import (
    RARE_RULE,
    TORCH_DTYPES,
    access_counts,
    apply_min_count,
    gather_table,
    refuse_min_count,
)
from hetgmp.train.checkpoint import MANIFEST, LoadedCheckpoint, open_checkpoint

log = logging.getLogger("hetgmp.export")


@dataclasses.dataclass
class ExportOptions:
    """What ``hetgmp export`` was asked for."""

    dtype: str = "fp32"
    min_count: int | None = None
    dataset: Path | None = None  # default: the checkpoint config's --dataset
    overwrite: bool = False


def find_dataset(ck: LoadedCheckpoint, override: Path | None) -> Any:
    """The training data set (for shapes, fields, vocabulary, counts); its fingerprint must
    be the checkpoint's."""
    cfg = ck.manifest.get("config", {})
    if override is not None:
        root = Path(override)
    else:
        name = Path(str(cfg.get("dataset", "")))
        cache = Path(str(cfg.get("cache_dir", ""))) / "datasets" / name
        root = name if name.is_dir() else cache
    try:
        ds = open_dataset(root)
    except DatasetError as err:
        raise ArtifactError(
            f"{ck.path / MANIFEST}: the training data set {root} cannot be opened ({err}); "
            "pass --dataset DIR (its meta.json gives the fields, its vocab/ the vocabulary)"
        ) from err
    want = ck.manifest.get("dataset_fingerprint")
    if want and ds.fingerprint and want != ds.fingerprint:
        raise ArtifactError(
            f"{ds.root / 'meta.json'}: fingerprint {ds.fingerprint[:12]} differs from the "
            f"checkpoint's {want[:12]} ({ck.path / MANIFEST}); pass the data set it trained on"
        )
    return ds


def bag_entries(ck: LoadedCheckpoint, ds: Any) -> list[dict[str, Any]]:
    """The manifest's ``multi_hot`` list: each multi-hot field (name, offset, cardinality) with
    its pooling from the checkpoint config's ``--pooling`` (one mode for all, or one per
    field); [] without multi-hot fields (the artifact is then version 1)."""
    fields = ds.meta.multi_hot
    if not fields:
        return []
    text = str(ck.manifest.get("config", {}).get("pooling", "sum"))
    modes = parse_pooling(text, len(fields))
    if len(modes) != len(fields) or not pooling_ok(text):
        raise ArtifactError(
            f"{ck.path / MANIFEST}: config pooling {text!r} does not give one mode (sum, mean) "
            f"for all or one per multi-hot field of {ds.root} ({len(fields)} fields)"
        )
    return [{**dataclasses.asdict(f), "pooling": m} for f, m in zip(fields, modes, strict=True)]


def _rows(
    ck: LoadedCheckpoint, ds: Any, opts: ExportOptions, info: dict[str, Any]
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors of rows.safetensors and their manifest entry."""
    num_rows, table_dim = int(info["num_rows"]), int(info["table_dim"])
    table = gather_table(ck, num_rows, table_dim)
    counts, source = access_counts(ck, ds, num_rows)
    tensors: dict[str, torch.Tensor] = {}
    entry: dict[str, Any] = {"counts": source, "min_count": opts.min_count, "dropped_rows": 0}
    if opts.min_count is not None:
        if counts is None:
            raise refuse_min_count(ck.path)
        every = [*ds.meta.fields, *ds.meta.multi_hot]  # (a bag value's row maps as any other)
        fields = [dataclasses.asdict(f) for f in every]
        table, index, dropped = apply_min_count(table, counts, opts.min_count, fields, rare_ids(ds))
        tensors["index"] = index
        entry.update(dropped_rows=dropped, dropped_rule=RARE_RULE)
        log.info(f"--min-count {opts.min_count}: kept {table.shape[0] - 1} of {num_rows} rows")
    tensors["rows"] = table.to(TORCH_DTYPES[opts.dtype]).contiguous()
    if counts is not None:
        tensors["counts"] = torch.from_numpy(counts)
    entry["shape"] = list(tensors["rows"].shape)
    return tensors, entry


def rare_ids(ds: Any) -> list[int | None]:
    """Each field's local rare id from the vocabulary, single-hot fields then multi-hot ones
    (None everywhere without one)."""
    if not has_vocabulary(ds.root):
        return [None] * (ds.meta.num_fields + len(ds.meta.multi_hot))
    return [f["rare_id"] for f in read_manifest(ds.root)["fields"]]


def _checkpoint_info(ck: LoadedCheckpoint) -> dict[str, Any]:
    m = ck.manifest
    for key in ("model", "embed_dim", "table_dim", "num_rows"):
        if key not in m:
            raise ArtifactError(f"{ck.path / MANIFEST}: lacks {key!r}; not a training checkpoint")
    return m


def served_dims(ck: LoadedCheckpoint, num_fields: int) -> list[int] | None:
    """The checkpoint's ``field_dims`` (``--embed-dim 16,8,...``) for the dense part's
    ``num_fields`` fields (single-hot, then multi-hot), as training built its model: None
    without a list, or when every field has the table's width (training's model then has no
    per-field dimensions either, :func:`hetgmp.train.config_checks.dims_of_fields`)."""
    m = ck.manifest
    dims = m.get("field_dims")
    if not dims:
        return None
    try:
        fields = FieldDims(num_fields, int(m["embed_dim"]), dims)
    except (ValueError, TypeError) as err:
        raise ArtifactError(
            f"{ck.path / MANIFEST}: field_dims {dims!r} do not fit the data set's "
            f"{num_fields} fields ({err})"
        ) from err
    return list(fields.dims) if fields.dims is not None else None


def _write(tmp: Path, ck: LoadedCheckpoint, ds: Any, opts: ExportOptions) -> dict[str, Any]:
    """Every file of the artifact into ``tmp``; the manifest's content (without files)."""
    info = _checkpoint_info(ck)
    meta = ds.meta
    bags = bag_entries(ck, ds)
    num_fields = meta.num_fields + len(bags)  # (one pooled row per multi-hot field)
    dims = served_dims(ck, num_fields)
    program = build_dense_program(
        info["model"],
        ck.dense()["model"],
        num_fields=num_fields,
        num_dense=meta.num_dense,
        embed_dim=int(info["embed_dim"]),
        dims=dims,  # (the program keeps each field's first d_f columns, as training did)
    )
    dense_entry = save_dense_weights(program, tmp / DENSE)
    program_entry = export_program(program, tmp / PROGRAM, int(info["table_dim"]))
    onnx_entry = export_onnx(program, tmp / ONNX, int(info["table_dim"]))
    tensors, rows_entry = _rows(ck, ds, opts, info)
    save_file(tensors, str(tmp / ROWS), metadata={"format": "hetgmp-serving-rows"})
    (tmp / CONFIG).write_text(json.dumps(info.get("config", {}), indent=2, sort_keys=True))
    vocab = has_vocabulary(ds.root)
    if vocab:
        shutil.copytree(ds.root / VOCAB, tmp / VOCAB)
    else:
        log.warning(
            f"{ds.root} has no vocabulary (vocab/): the artifact scores preprocessed ids only "
            "(Scorer.score), not raw files (hetgmp predict)"
        )
    return {
        "model": info["model"],
        "embed_dim": int(info["embed_dim"]),
        "table_dim": int(info["table_dim"]),
        "num_rows": int(info["num_rows"]),
        "num_fields": meta.num_fields,
        "num_dense": meta.num_dense,
        "fields": [dataclasses.asdict(f) for f in meta.fields],
        **({"multi_hot": bags} if bags else {}),  # (version 2; without: version 1, as before)
        **({"field_dims": dims} if dims else {}),  # (version 3)
        "dtype": opts.dtype,
        "rows": rows_entry,
        "dense": dense_entry,
        "program": program_entry,
        "onnx": onnx_entry,
        "vocabulary": VOCAB if vocab else None,
        "checkpoint": {
            "path": str(ck.path),
            "step": ck.position.step,
            "world_size": int(ck.manifest.get("world_size", 1)),
            "dataset_fingerprint": ck.manifest.get("dataset_fingerprint"),
        },
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def export_checkpoint(checkpoint: Path, out: Path, opts: ExportOptions | None = None) -> Path:
    """Write the serving artifact of ``checkpoint`` (a step directory, or a checkpoint
    directory with ``latest``) to ``out``; returns ``out``."""
    opts = opts or ExportOptions()
    if opts.dtype not in DTYPES:
        raise ValueError(f"--dtype {opts.dtype!r}: choose one of {', '.join(DTYPES)}")
    if opts.min_count is not None and opts.min_count < 1:
        raise ValueError(f"--min-count must be >= 1, got {opts.min_count}")
    out = Path(out)
    if out.exists() and not opts.overwrite:
        raise ArtifactError(f"{out}: exists; pass --overwrite to replace it")
    ck = open_checkpoint(Path(checkpoint))
    ds = find_dataset(ck, opts.dataset)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a failed export
    tmp.mkdir()
    try:
        manifest = _write(tmp, ck, ds, opts)
        write_manifest(tmp, manifest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out
