"""Writing a dataset directory: streamed ``.npy`` appends, renamed into place when complete.

See :mod:`hetgmp.data.format` for the on-disk format.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np

from hetgmp.data.dataset_meta import (
    SPLITS,
    DatasetError,
    DatasetMeta,
    FieldInfo,
    array_paths,
    id_dtype_for,
)
from hetgmp.data.dataset_reader import Dataset, compute_fingerprint, open_dataset
from hetgmp.data.multi_hot import MULTI_HOT_VERSION, check_chunk, fold_stats, multi_hot_paths
from hetgmp.signals import remove_stale_temps, temp_name

_HEADER_BYTES = 128  # fixed .npy v1 header size so we can rewrite the shape in place


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
        self._f.write(arr.data.cast("B"))
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
        multi_hot: list[FieldInfo] | None = None,
    ) -> None:
        self.out = Path(out)
        if self.out.exists() and not overwrite:
            raise DatasetError(f"{self.out}: already exists (pass overwrite to replace it)")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.out)  # what a killed earlier run of this output left
        self.tmp = temp_name(self.out)
        self.tmp.mkdir()
        self.overwrite = overwrite
        self.meta = DatasetMeta(
            fields=fields,
            num_dense=num_dense,
            splits={},
            name=name,
            multi_hot=list(multi_hot or []),
        )
        num_emb = self.meta.num_embeddings
        self.id_dtype = np.dtype(id_dtype) if id_dtype is not None else id_dtype_for(num_emb)
        self.meta.id_dtype = str(self.id_dtype)
        self._files: dict[tuple[str, str], _NpyAppender] = {}
        self._upper = np.array([f.offset + f.cardinality for f in fields], dtype=np.int64)
        self._lower = np.array([f.offset for f in fields], dtype=np.int64)
        self._ranges: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # split: (min, max) ids

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
        multi_hot: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        """Append a chunk of samples with *global* ids to ``split``.

        ``multi_hot`` holds, per multi-hot field, the chunk's ``(values, offsets)``: offsets of
        length ``n + 1`` from 0 to ``len(values)`` (:mod:`hetgmp.data.multi_hot`)."""
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
        if n:
            self._note_range(split, sparse)
        self._appender(split, "sparse", self.id_dtype, (nf,)).append(sparse)
        if self.meta.num_dense:
            if dense is None or dense.shape != (n, self.meta.num_dense):
                raise DatasetError(f"dense chunk must have shape ({n}, {self.meta.num_dense})")
            self._appender(split, "dense", np.float32, (self.meta.num_dense,)).append(dense)
        self._appender(split, "labels", np.float32, (1,)).append(
            np.asarray(labels, dtype=np.float32).reshape(n, 1)
        )
        self._append_multi_hot(split, n, multi_hot or [], check_ids)

    def _append_multi_hot(
        self, split: str, n: int, bags: Sequence[tuple[np.ndarray, np.ndarray]], check_ids: bool
    ) -> None:
        """Append each multi-hot field's lists, offsets shifted past what the split holds."""
        if not bags and not self.meta.multi_hot:
            return
        if len(bags) != len(self.meta.multi_hot):
            raise DatasetError(
                f"chunk has {len(bags)} multi-hot fields, dataset has {len(self.meta.multi_hot)}"
            )
        # (None until the split's first chunk of that field: fold_stats starts from it)
        empty = cast("list[dict[str, Any]]", [None] * len(bags))
        stats: list[Any] = self.meta.multi_hot_stats.setdefault(split, empty)
        for k, (field, (values, offsets)) in enumerate(zip(self.meta.multi_hot, bags, strict=True)):
            values, offsets = np.asarray(values), np.asarray(offsets, dtype=np.int64)
            check_chunk(field, values, offsets, n, check_ids)
            vals, offs = self._multi_hot_files(split, k)
            offs.append(offsets[1:] + vals.rows)
            vals.append(values)
            stats[k] = fold_stats(stats[k], values, np.diff(offsets))

    def _multi_hot_files(self, split: str, k: int) -> tuple[_NpyAppender, _NpyAppender]:
        """The values and offsets files of field ``k`` (the offsets start with their 0)."""
        key = (split, f"multi_hot_{k}_values")
        if key not in self._files:
            paths = multi_hot_paths(self.tmp, split, k)
            self._files[key] = _NpyAppender(paths["values"], self.id_dtype, ())
            offs = _NpyAppender(paths["offsets"], np.dtype(np.int64), ())
            offs.append(np.zeros(1, dtype=np.int64))
            self._files[(split, f"multi_hot_{k}_offsets")] = offs
        return self._files[key], self._files[(split, f"multi_hot_{k}_offsets")]

    def _note_range(self, split: str, sparse: np.ndarray) -> None:
        """Fold the chunk's per-column smallest and largest ids into the split's."""
        lo, hi = sparse.min(axis=0).astype(np.int64), sparse.max(axis=0).astype(np.int64)
        if split in self._ranges:
            lo = np.minimum(lo, self._ranges[split][0])
            hi = np.maximum(hi, self._ranges[split][1])
        self._ranges[split] = (lo, hi)

    def close(self) -> Dataset:
        for split in SPLITS:
            if (split, "sparse") not in self._files:
                self._appender(split, "sparse", self.id_dtype, (self.meta.num_fields,))
                if self.meta.num_dense:
                    self._appender(split, "dense", np.float32, (self.meta.num_dense,))
                self._appender(split, "labels", np.float32, (1,))
            for k in range(len(self.meta.multi_hot)):
                self._multi_hot_files(split, k)
        for f in self._files.values():
            f.close()
        self.meta.splits = {s: self._files[(s, "sparse")].rows for s in SPLITS}
        self.meta.id_ranges = {
            s: {"min": lo.tolist(), "max": hi.tolist()} for s, (lo, hi) in self._ranges.items()
        }
        if self.meta.multi_hot:  # (older hetgmp refuses it rather than ignoring the lists)
            self.meta.version = MULTI_HOT_VERSION
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
    extra_files: Callable[[Path], None] | None = None,
    multi_hot: list[FieldInfo] | None = None,
) -> Dataset:
    """Write in-memory arrays ``{split: (sparse, dense, labels)}`` as a dataset directory.

    With ``multi_hot`` fields, each split's tuple has a fourth item: per field, its
    ``(values, offsets)`` (see :meth:`DatasetWriter.append`).

    ``extra_files(tmp)`` may add files (e.g. the vocabulary) to the directory before it is
    renamed into place.
    """
    w = DatasetWriter(out, fields, num_dense, name=name, overwrite=overwrite, multi_hot=multi_hot)
    try:
        bags: list[Any]
        for split, (sp, de, lb, *bags) in splits.items():
            w.append(split, sp, de, lb, multi_hot=bags[0] if bags else None)
        w.meta.source = dict(source or {})
        w.meta.stats = dict(stats or {})
        w.meta.best_auc = best_auc
        if extra_files is not None:
            extra_files(w.tmp)
        return w.close()
    except BaseException:
        w.abort()
        raise
