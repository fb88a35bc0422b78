"""Ids out of their field's range are refused when a data set is opened for training.

Writers record each split's per-column smallest and largest global id in ``meta.json``
(``id_ranges``, :class:`~hetgmp.data.dataset_writer.DatasetWriter`), so the check is a comparison
per column against the fields and the table, with no pass over the arrays. Directories written
before the ranges were recorded (and HET-GMP's, without ``meta.json``) are scanned once, in
chunks of the memory-mapped arrays. A recorded range describes the arrays as written: if they
are changed afterwards, ``hetgmp dataset verify`` finds it (the fingerprint, and every id).
"""

from __future__ import annotations

import numpy as np

from hetgmp.data.dataset_meta import SPLITS, DatasetError, array_paths
from hetgmp.data.dataset_reader import Dataset
from hetgmp.data.multi_hot import check_chunk, multi_hot_paths, refuse_multi_hot

_SCAN_ROWS = 1 << 20


def _scan(sparse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column (min, max) of a ``[N, F]`` id array (N > 0), one chunk at a time."""
    lo = np.full(sparse.shape[1], np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(sparse.shape[1], np.iinfo(np.int64).min, dtype=np.int64)
    for start in range(0, sparse.shape[0], _SCAN_ROWS):
        chunk = np.asarray(sparse[start : start + _SCAN_ROWS])
        lo = np.minimum(lo, chunk.min(axis=0))
        hi = np.maximum(hi, chunk.max(axis=0))
    return lo, hi


def split_ranges(ds: Dataset, split: str) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """(per-column min, max, whether they were scanned rather than recorded) of ``split``'s
    ids, or None when the split is absent or empty."""
    if not ds.has_split(split):
        return None
    rec = ds.meta.id_ranges.get(split)
    nf = ds.meta.num_fields
    if isinstance(rec, dict) and len(rec.get("min", ())) == nf and len(rec.get("max", ())) == nf:
        return np.asarray(rec["min"], np.int64), np.asarray(rec["max"], np.int64), False
    sparse = ds.split(split).sparse
    if sparse.shape[0] == 0:
        return None
    lo, hi = _scan(sparse)
    return lo, hi, True


def check_id_ranges(
    ds: Dataset, num_rows: int, what: str = "training", multi_hot_ok: bool = False
) -> list[str]:
    """Raise :class:`DatasetError` naming the file and column when a split holds an id outside
    its field's ``[offset, offset + cardinality)`` or the table's ``num_rows`` rows; returns
    the splits whose ranges had to be scanned (nothing recorded in ``meta.json``).

    A data set with multi-hot fields is refused first (``what`` says who refuses it): its
    lists would otherwise be silently left out -- unless ``multi_hot_ok`` (the partitioner,
    which reads them), when the training split's lists are checked too."""
    if multi_hot_ok:
        _check_train_lists(ds)
    else:
        refuse_multi_hot(ds.meta, ds.root, what)
    scanned: list[str] = []
    off = ds.meta.field_offsets
    end = np.minimum(off + ds.meta.field_cardinalities, num_rows)
    for split in SPLITS:
        got = split_ranges(ds, split)
        if got is None:
            continue
        lo, hi, was_scanned = got
        if was_scanned:
            scanned.append(split)
        bad = np.flatnonzero((lo < off) | (hi >= end))
        if bad.size:
            f = int(bad[0])
            how = "scanned" if was_scanned else "recorded in meta.json when it was written"
            raise DatasetError(
                f"{array_paths(ds.root, split)['sparse']}: column {f} (field "
                f"{ds.meta.fields[f].name!r}) holds ids {int(lo[f])}..{int(hi[f])} ({how}), "
                f"outside the field's [{int(off[f])}, {int(off[f]) + ds.meta.fields[f].cardinality})"
                f" of the table's {num_rows} rows: the arrays do not match meta.json "
                f"(`hetgmp dataset verify {ds.root}` lists every bad id)"
            )
    return scanned


def _check_train_lists(ds: Dataset) -> None:
    """Raise :class:`DatasetError` (naming the files) when a multi-hot list of the training
    split is malformed or holds an id outside its field's range."""
    n = len(ds.train)
    for k, field in enumerate(ds.meta.multi_hot):
        mh = ds.train.multi_hot[k]
        try:
            check_chunk(field, np.asarray(mh.values), np.asarray(mh.offsets), n, check_ids=True)
        except DatasetError as err:
            where = multi_hot_paths(ds.root, "train", k)["values"]
            raise DatasetError(
                f"{where}: {err} (`hetgmp dataset verify {ds.root}` lists every bad id)"
            ) from err
