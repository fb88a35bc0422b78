"""Opening a dataset directory: memory-mapped splits, the fingerprint, HET-GMP directories.

See :mod:`hetgmp.data.format` for the on-disk format.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from hetgmp.data.dataset_meta import (
    SPLITS,
    DatasetError,
    DatasetMeta,
    FieldInfo,
    array_paths,
)
from hetgmp.data.multi_hot import MultiHotArrays, multi_hot_paths, open_field

_HASH_CHUNK = 1 << 24


@dataclasses.dataclass
class SplitArrays:
    """Memory-mapped arrays of one split. ``dense`` is None when the data set has none;
    ``multi_hot`` holds one values + offsets pair per multi-hot field (none in version 1)."""

    sparse: np.ndarray
    dense: np.ndarray | None
    labels: np.ndarray
    multi_hot: list[MultiHotArrays] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return int(self.sparse.shape[0])


class Dataset:
    """An opened dataset directory: metadata plus lazily memory-mapped splits."""

    def __init__(self, root: Path, meta: DatasetMeta, derived: bool = False) -> None:
        self.root = root
        self.meta = meta
        self.derived = derived  # True for a HET-GMP directory without meta.json
        self._splits: dict[str, SplitArrays] = {}

    @property
    def fingerprint(self) -> str:
        return self.meta.fingerprint

    def has_split(self, split: str) -> bool:
        return array_paths(self.root, split)["sparse"].exists()

    def split(self, split: str) -> SplitArrays:
        if split not in self._splits:
            self._splits[split] = _open_split(self.root, split, self.meta)
        return self._splits[split]

    @property
    def train(self) -> SplitArrays:
        return self.split("train")

    @property
    def test(self) -> SplitArrays:
        return self.split("test")

    def __repr__(self) -> str:
        return (
            f"Dataset({str(self.root)!r}, fields={self.meta.num_fields}, "
            f"rows={self.meta.num_embeddings}, splits={self.meta.splits})"
        )


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)  # (data, never code)
    except FileNotFoundError:
        raise DatasetError(f"{path}: file is missing") from None
    except ValueError as err:
        raise DatasetError(f"{path}: not a readable .npy file ({err})") from err


def _open_split(root: Path, split: str, meta: DatasetMeta) -> SplitArrays:
    paths = array_paths(root, split)
    sparse = _load_npy(paths["sparse"])
    if sparse.ndim != 2 or sparse.shape[1] != meta.num_fields:
        raise DatasetError(
            f"{paths['sparse']}: shape {sparse.shape}, expected [N, {meta.num_fields}]"
        )
    if sparse.dtype.kind != "i":
        raise DatasetError(f"{paths['sparse']}: dtype {sparse.dtype}, expected int32/int64")
    n = sparse.shape[0]
    if split in meta.splits and meta.splits[split] != n:
        raise DatasetError(
            f"{paths['sparse']}: {n} rows but meta.json records {meta.splits[split]}"
        )
    labels = _load_npy(paths["labels"])
    if labels.shape[0] != n:
        raise DatasetError(f"{paths['labels']}: {labels.shape[0]} rows, expected {n}")
    dense = None
    if meta.num_dense > 0:
        dense = _load_npy(paths["dense"])
        if dense.shape != (n, meta.num_dense):
            raise DatasetError(
                f"{paths['dense']}: shape {dense.shape}, expected ({n}, {meta.num_dense})"
            )
    multi = [open_field(_load_npy, root, split, k, f, n) for k, f in enumerate(meta.multi_hot)]
    return SplitArrays(sparse=sparse, dense=dense, labels=labels, multi_hot=multi)


def _iter_chunks(arr: np.ndarray, rows: int) -> Iterator[np.ndarray]:
    for start in range(0, arr.shape[0], rows):
        yield np.ascontiguousarray(arr[start : start + rows])


def compute_fingerprint(root: Path, meta: DatasetMeta) -> str:
    """SHA-256 over field cardinalities and every array's shape, dtype and bytes (streamed).

    Multi-hot fields add their cardinalities and files after the rest, so a version-1
    directory's fingerprint is what it always was."""
    h = hashlib.sha256()
    h.update(json.dumps([f.cardinality for f in meta.fields]).encode())
    if meta.multi_hot:
        h.update(json.dumps({"multi_hot": [f.cardinality for f in meta.multi_hot]}).encode())
    for split in SPLITS:
        paths = array_paths(root, split)
        named = [(kind, paths[kind]) for kind in ("sparse", "dense", "labels")]
        for k in range(len(meta.multi_hot)):
            mh = multi_hot_paths(root, split, k)
            named += [(f"multi_hot_{k}_{kind}", mh[kind]) for kind in ("values", "offsets")]
        for kind, p in named:
            if p.exists():
                _hash_array(h, f"{split}/{kind}", _load_npy(p))
    return h.hexdigest()


def _hash_array(h: Any, label: str, arr: np.ndarray) -> None:
    h.update(f"{label}:{arr.dtype.str}:{arr.shape}".encode())
    rows = max(1, _HASH_CHUNK // max(1, arr.itemsize * int(np.prod(arr.shape[1:]))))
    for chunk in _iter_chunks(arr, rows):
        h.update(chunk.data.cast("B"))


def open_dataset(path: str | os.PathLike[str]) -> Dataset:
    """Open a dataset directory (ours, or HET-GMP's without ``meta.json``)."""
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"{root}: dataset directory does not exist")
    meta_path = root / "meta.json"
    if meta_path.exists():
        try:
            d = json.loads(meta_path.read_text())
        except json.JSONDecodeError as err:
            raise DatasetError(f"{meta_path}: not valid JSON ({err})") from err
        return Dataset(root, DatasetMeta.from_dict(d, where=str(meta_path)))
    if array_paths(root, "train")["sparse"].exists():
        return Dataset(root, derive_meta(root), derived=True)
    raise DatasetError(
        f"{root}: neither meta.json nor train_sparse_feats.npy found; is this a dataset directory?"
    )


def derive_meta(root: Path) -> DatasetMeta:
    """Metadata for a HET-GMP-style directory: scan sparse ids per field for min/max."""
    train = _load_npy(array_paths(root, "train")["sparse"])
    if train.ndim != 2:
        raise DatasetError(f"{root}/train_sparse_feats.npy: expected a 2-D array")
    num_fields = train.shape[1]
    lo = np.full(num_fields, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(num_fields, -1, dtype=np.int64)
    splits: dict[str, int] = {}
    num_dense = 0
    for split in SPLITS:
        paths = array_paths(root, split)
        if not paths["sparse"].exists():
            continue
        arr = _load_npy(paths["sparse"])
        splits[split] = int(arr.shape[0])
        for chunk in _iter_chunks(arr, 1 << 20):
            if chunk.size:
                lo = np.minimum(lo, chunk.min(axis=0))
                hi = np.maximum(hi, chunk.max(axis=0))
        if paths["dense"].exists():
            num_dense = int(_load_npy(paths["dense"]).shape[1])
    if (lo < 0).any():
        raise DatasetError(f"{root}: negative ids in train/test_sparse_feats.npy")
    order = np.argsort(lo, kind="stable")
    # Fields laid out in id order; a field owns [its min, next field's min).
    fields: list[FieldInfo | None] = [None] * num_fields
    for k, f in enumerate(order):
        start = int(lo[f]) if k > 0 else 0
        end = int(lo[order[k + 1]]) if k + 1 < num_fields else int(hi.max()) + 1
        if end <= int(hi[f]):
            raise DatasetError(f"{root}: id ranges of fields overlap; cannot derive metadata")
        fields[f] = FieldInfo(f"f{f}", end - start, start)
    meta = DatasetMeta(
        fields=[f for f in fields if f is not None],
        num_dense=num_dense,
        splits=splits,
        id_dtype=str(train.dtype),
        name=root.name,
        source={"kind": "hetgmp-derived", "note": "metadata derived from arrays (no meta.json)"},
    )
    meta.fingerprint = compute_fingerprint(root, meta)
    return meta
