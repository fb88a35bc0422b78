"""The on-disk dataset directory (format ``hetgmp-dataset`` version 1).

Layout (file names compatible with HET-GMP's preprocessed Criteo directories)::

    meta.json                    this module's DatasetMeta, as JSON
    train_sparse_feats.npy       int32 or int64 [N, F]; global id = field offset + local id
    train_dense_feats.npy        float32 [N, num_dense]            (absent when num_dense == 0)
    train_labels.npy             float32 [N, 1]
    test_*.npy                   the same for the test split

Arrays are opened with ``mmap_mode="r"`` so data sets larger than RAM work. ids are int32 when
``num_embeddings < 2**31`` and int64 otherwise. The *fingerprint* is a SHA-256 over the shapes,
dtypes and bytes of every array plus the field cardinalities; plans and checkpoints record it and
refuse data whose fingerprint differs.

A directory written by HET-GMP's own preprocessing (the ``.npy`` files without ``meta.json``) is
accepted: its metadata is derived by scanning the arrays (per-field min/max give offsets and
cardinalities) and its fingerprint is computed the same way.

Writers stream: :class:`DatasetWriter` appends chunks to ``.npy`` files whose header is rewritten
with the final row count at the end, inside a temporary directory that is renamed into place only
when everything is written, so a crash never leaves a directory that looks complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

FORMAT_NAME = "hetgmp-dataset"
FORMAT_VERSION = 1
SPLITS = ("train", "test")
INT32_LIMIT = 2**31 - 1
_HEADER_BYTES = 128  # fixed .npy v1 header size so we can rewrite the shape in place
_HASH_CHUNK = 1 << 24


class DatasetError(ValueError):
    """A dataset directory is missing, malformed or inconsistent; the message names the file."""


@dataclasses.dataclass
class FieldInfo:
    """One categorical field: its name, number of distinct ids and global id offset."""

    name: str
    cardinality: int
    offset: int


@dataclasses.dataclass
class DatasetMeta:
    """Contents of ``meta.json``."""

    fields: list[FieldInfo]
    num_dense: int
    splits: dict[str, int]
    id_dtype: str = "int32"
    name: str = ""
    fingerprint: str = ""
    source: dict[str, Any] = dataclasses.field(default_factory=dict)
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    best_auc: float | None = None  # AUC of the true probabilities on test (generated data)
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    @property
    def num_fields(self) -> int:
        return len(self.fields)

    @property
    def num_embeddings(self) -> int:
        return sum(f.cardinality for f in self.fields)

    @property
    def field_offsets(self) -> np.ndarray:
        return np.array([f.offset for f in self.fields], dtype=np.int64)

    @property
    def field_cardinalities(self) -> np.ndarray:
        return np.array([f.cardinality for f in self.fields], dtype=np.int64)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["num_embeddings"] = self.num_embeddings
        return json.dumps(d, indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "meta.json") -> DatasetMeta:
        if d.get("format") != FORMAT_NAME:
            raise DatasetError(f"{where}: format is {d.get('format')!r}, expected {FORMAT_NAME!r}")
        if int(d.get("version", -1)) > FORMAT_VERSION:
            raise DatasetError(
                f"{where}: format version {d.get('version')} is newer than this hetgmp "
                f"supports ({FORMAT_VERSION}); upgrade hetgmp"
            )
        try:
            fields = [FieldInfo(**f) for f in d["fields"]]
            known = {f.name for f in dataclasses.fields(cls)}
            kw = {k: v for k, v in d.items() if k in known and k != "fields"}
            meta = cls(fields=fields, **kw)
        except (KeyError, TypeError) as err:
            raise DatasetError(f"{where}: malformed metadata ({err})") from err
        if "num_embeddings" in d and int(d["num_embeddings"]) != meta.num_embeddings:
            raise DatasetError(f"{where}: num_embeddings disagrees with the field cardinalities")
        return meta


def id_dtype_for(num_embeddings: int) -> np.dtype:
    """int32 where every id fits, int64 beyond."""
    return np.dtype(np.int32) if num_embeddings <= INT32_LIMIT else np.dtype(np.int64)


def make_fields(names: list[str], cardinalities: list[int]) -> list[FieldInfo]:
    """Fields laid out one after another in the global id space."""
    offsets = np.concatenate([[0], np.cumsum(cardinalities)[:-1]]).astype(np.int64)
    return [
        FieldInfo(n, int(c), int(o)) for n, c, o in zip(names, cardinalities, offsets, strict=True)
    ]


def array_paths(root: Path, split: str) -> dict[str, Path]:
    return {
        "sparse": root / f"{split}_sparse_feats.npy",
        "dense": root / f"{split}_dense_feats.npy",
        "labels": root / f"{split}_labels.npy",
    }


@dataclasses.dataclass
class SplitArrays:
    """Memory-mapped arrays of one split. ``dense`` is None when the data set has none."""

    sparse: np.ndarray
    dense: np.ndarray | None
    labels: np.ndarray

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
        return np.load(path, mmap_mode="r")
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
    return SplitArrays(sparse=sparse, dense=dense, labels=labels)


def _iter_chunks(arr: np.ndarray, rows: int) -> Iterator[np.ndarray]:
    for start in range(0, arr.shape[0], rows):
        yield np.ascontiguousarray(arr[start : start + rows])


def compute_fingerprint(root: Path, meta: DatasetMeta) -> str:
    """SHA-256 over field cardinalities and every array's shape, dtype and bytes (streamed)."""
    h = hashlib.sha256()
    h.update(json.dumps([f.cardinality for f in meta.fields]).encode())
    for split in SPLITS:
        paths = array_paths(root, split)
        for kind in ("sparse", "dense", "labels"):
            p = paths[kind]
            if not p.exists():
                continue
            arr = _load_npy(p)
            h.update(f"{split}/{kind}:{arr.dtype.str}:{arr.shape}".encode())
            rows = max(1, _HASH_CHUNK // max(1, arr.itemsize * int(np.prod(arr.shape[1:]))))
            for chunk in _iter_chunks(arr, rows):
                h.update(memoryview(chunk).cast("B"))
    return h.hexdigest()


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


class _NpyAppender:
    """Append rows to a .npy file; the header is rewritten with the true row count on close."""

    def __init__(self, path: Path, dtype: np.dtype, row_shape: tuple[int, ...]) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.row_shape = row_shape
        self.rows = 0
        self._f: BinaryIO = open(path, "wb")
        self._f.write(self._header(0))

    def _header(self, rows: int) -> bytes:
        d = {"descr": self.dtype.str, "fortran_order": False, "shape": (rows, *self.row_shape)}
        text = repr(d).encode("latin1")
        pad = _HEADER_BYTES - 10 - len(text) - 1
        if pad < 0:
            raise DatasetError(f"{self.path}: npy header too long")
        body = text + b" " * pad + b"\n"
        return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body

    def append(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        if arr.shape[1:] != self.row_shape:
            raise DatasetError(f"{self.path}: row shape {arr.shape[1:]}, expected {self.row_shape}")
        if arr.size == 0:  # memoryview cannot cast an empty array; nothing to write anyway
            return
        self._f.write(memoryview(arr).cast("B"))
        self.rows += arr.shape[0]

    def close(self) -> None:
        self._f.seek(0)
        self._f.write(self._header(self.rows))
        self._f.close()


class DatasetWriter:
    """Stream a dataset directory to disk.

    Usage::

        with DatasetWriter(out, fields, num_dense=13) as w:
            w.append("train", sparse, dense, labels)   # any number of chunks, any split order
            w.meta.source = {...}; w.meta.stats = {...}
        # out/ now exists, complete, with meta.json and fingerprint

    The directory appears at ``out`` only when :meth:`close` succeeds; an exception inside the
    ``with`` block removes the temporary directory. ``overwrite`` replaces an existing ``out``.
    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        fields: list[FieldInfo],
        num_dense: int,
        *,
        name: str = "",
        overwrite: bool = False,
        id_dtype: np.dtype | None = None,
    ) -> None:
        self.out = Path(out)
        if self.out.exists() and not overwrite:
            raise DatasetError(f"{self.out}: already exists (pass overwrite to replace it)")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.out.parent / f".{self.out.name}.tmp-{uuid.uuid4().hex[:8]}"
        self.tmp.mkdir()
        self.overwrite = overwrite
        num_emb = sum(f.cardinality for f in fields)
        self.id_dtype = np.dtype(id_dtype) if id_dtype is not None else id_dtype_for(num_emb)
        self.meta = DatasetMeta(
            fields=fields, num_dense=num_dense, splits={}, id_dtype=str(self.id_dtype), name=name
        )
        self._files: dict[tuple[str, str], _NpyAppender] = {}
        self._upper = np.array([f.offset + f.cardinality for f in fields], dtype=np.int64)
        self._lower = np.array([f.offset for f in fields], dtype=np.int64)

    def _appender(self, split: str, kind: str, dtype: Any, row_shape: tuple[int, ...]):
        key = (split, kind)
        if key not in self._files:
            self._files[key] = _NpyAppender(array_paths(self.tmp, split)[kind], dtype, row_shape)
        return self._files[key]

    def append(
        self,
        split: str,
        sparse: np.ndarray,
        dense: np.ndarray | None,
        labels: np.ndarray,
        *,
        check_ids: bool = True,
    ) -> None:
        """Append a chunk of samples with *global* ids to ``split``."""
        if split not in SPLITS:
            raise DatasetError(f"unknown split {split!r}; expected one of {SPLITS}")
        n, nf = sparse.shape
        if nf != self.meta.num_fields:
            raise DatasetError(f"chunk has {nf} fields, dataset has {self.meta.num_fields}")
        if check_ids and n:
            if (sparse < self._lower).any() or (sparse >= self._upper).any():
                bad = np.argwhere((sparse < self._lower) | (sparse >= self._upper))[0]
                raise DatasetError(
                    f"id {int(sparse[bad[0], bad[1]])} of field {self.meta.fields[bad[1]].name} "
                    f"is outside its range [{self._lower[bad[1]]}, {self._upper[bad[1]]})"
                )
        self._appender(split, "sparse", self.id_dtype, (nf,)).append(sparse)
        if self.meta.num_dense:
            if dense is None or dense.shape != (n, self.meta.num_dense):
                raise DatasetError(f"dense chunk must have shape ({n}, {self.meta.num_dense})")
            self._appender(split, "dense", np.float32, (self.meta.num_dense,)).append(dense)
        self._appender(split, "labels", np.float32, (1,)).append(
            np.asarray(labels, dtype=np.float32).reshape(n, 1)
        )

    def close(self) -> Dataset:
        for split in SPLITS:
            if (split, "sparse") not in self._files:
                self._appender(split, "sparse", self.id_dtype, (self.meta.num_fields,))
                if self.meta.num_dense:
                    self._appender(split, "dense", np.float32, (self.meta.num_dense,))
                self._appender(split, "labels", np.float32, (1,))
        for f in self._files.values():
            f.close()
        self.meta.splits = {s: self._files[(s, "sparse")].rows for s in SPLITS}
        self.meta.fingerprint = compute_fingerprint(self.tmp, self.meta)
        (self.tmp / "meta.json").write_text(self.meta.to_json())
        if self.out.exists():
            shutil.rmtree(self.out)
        os.replace(self.tmp, self.out)
        return open_dataset(self.out)

    def abort(self) -> None:
        for f in self._files.values():
            if not f._f.closed:
                f._f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self._dataset = self.close()
        else:
            self.abort()


def write_dataset(
    out: str | os.PathLike[str],
    fields: list[FieldInfo],
    splits: dict[str, tuple[np.ndarray, np.ndarray | None, np.ndarray]],
    *,
    num_dense: int = 0,
    name: str = "",
    source: dict[str, Any] | None = None,
    stats: dict[str, Any] | None = None,
    best_auc: float | None = None,
    overwrite: bool = False,
) -> Dataset:
    """Write in-memory arrays ``{split: (sparse, dense, labels)}`` as a dataset directory."""
    w = DatasetWriter(out, fields, num_dense, name=name, overwrite=overwrite)
    try:
        for split, (sp, de, lb) in splits.items():
            w.append(split, sp, de, lb)
        w.meta.source = dict(source or {})
        w.meta.stats = dict(stats or {})
        w.meta.best_auc = best_auc
        return w.close()
    except BaseException:
        w.abort()
        raise
