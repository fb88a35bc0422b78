"""Multi-hot fields on disk: a ragged ``values`` + ``offsets`` pair per field and split.

A multi-hot field holds a list of ids per sample (a user's recent items, an ad's keywords).
Sample ``i``'s list in field ``k`` of a split is ``values[offsets[i]:offsets[i + 1]]``, with
global ids (field offset + local id, in the same id space as the single-hot fields, after them).
``offsets`` is int64 ``[N + 1]``, starts at 0, never decreases and ends at ``len(values)``; an
empty list is allowed (``offsets[i] == offsets[i + 1]``). The files are
``{split}_multi_hot_{k:03d}_values.npy`` and ``{split}_multi_hot_{k:03d}_offsets.npy``, by the
field's position in ``meta.json``'s ``multi_hot`` list (not its name, which may hold anything).

A directory with multi-hot fields is format version 2 (:data:`MULTI_HOT_VERSION`); one without
is still written as version 1, so older hetgmp keeps reading it, and refuses a version-2 one with
"upgrade hetgmp" rather than silently ignoring its lists. See ``docs/dataset_format.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hetgmp.data.dataset_meta import DatasetError, FieldInfo

MULTI_HOT_VERSION = 2
NOT_TRAINED_YET = (
    "multi-hot fields train through `hetgmp train` (CPU, or one GPU) and the Python API only "
    "so far: issue 34"
)


@dataclasses.dataclass
class MultiHotArrays:
    """One multi-hot field of one split: ``values`` (ids) and ``offsets`` (int64 ``[N + 1]``)."""

    values: np.ndarray
    offsets: np.ndarray

    def lengths(self) -> np.ndarray:
        """The list length of every sample (int64 ``[N]``)."""
        return np.diff(np.asarray(self.offsets, dtype=np.int64))


def multi_hot_paths(root: Path, split: str, index: int) -> dict[str, Path]:
    """The values and offsets files of multi-hot field number ``index`` in ``split``."""
    stem = f"{split}_multi_hot_{index:03d}"
    return {"values": root / f"{stem}_values.npy", "offsets": root / f"{stem}_offsets.npy"}


def check_chunk(
    field: FieldInfo, values: np.ndarray, offsets: np.ndarray, n: int, check_ids: bool
) -> None:
    """Raise :class:`DatasetError` unless ``(values, offsets)`` is a sound chunk of ``n`` lists."""
    where = f"multi-hot field {field.name}"
    if offsets.ndim != 1 or offsets.shape[0] != n + 1:
        raise DatasetError(f"{where}: offsets has shape {offsets.shape}, expected ({n + 1},)")
    if values.ndim != 1:
        raise DatasetError(f"{where}: values must be 1-D, got shape {values.shape}")
    if int(offsets[0]) != 0 or int(offsets[-1]) != values.shape[0]:
        raise DatasetError(
            f"{where}: offsets must run from 0 to len(values) = {values.shape[0]}, "
            f"got {int(offsets[0])}..{int(offsets[-1])}"
        )
    down = np.flatnonzero(np.diff(offsets) < 0)
    if down.size:
        raise DatasetError(f"{where}: offsets decrease after sample {int(down[0])}")
    if check_ids and values.size:
        lo, hi = field.offset, field.offset + field.cardinality
        bad = np.flatnonzero((values < lo) | (values >= hi))
        if bad.size:
            raise DatasetError(
                f"{where}: id {int(values[bad[0]])} is outside its range [{lo}, {hi})"
            )


def fold_stats(old: dict[str, Any] | None, values: np.ndarray, lengths: np.ndarray) -> dict:
    """A field's split statistics (``meta.json``'s ``multi_hot_stats``) with one more chunk."""
    new = {
        "samples": int(lengths.size),
        "values": int(values.size),
        "min_length": int(lengths.min()) if lengths.size else None,
        "max_length": int(lengths.max()) if lengths.size else None,
        "min_id": int(values.min()) if values.size else None,
        "max_id": int(values.max()) if values.size else None,
    }
    if old is None:
        return new
    out = {"samples": old["samples"] + new["samples"], "values": old["values"] + new["values"]}
    for key, pick in (("min_length", min), ("max_length", max), ("min_id", min), ("max_id", max)):
        got = [v for v in (old[key], new[key]) if v is not None]
        out[key] = pick(got) if got else None
    return out


def open_field(
    load: Callable[[Path], np.ndarray], root: Path, split: str, index: int, field: FieldInfo, n: int
) -> MultiHotArrays:
    """Memory-map (with ``load``) one multi-hot field of ``split``; check shapes and ends."""
    paths = multi_hot_paths(root, split, index)
    values, offsets = load(paths["values"]), load(paths["offsets"])
    if values.ndim != 1 or values.dtype.kind != "i":
        raise DatasetError(
            f"{paths['values']}: shape {values.shape} dtype {values.dtype}, expected 1-D int "
            f"(multi-hot field {field.name})"
        )
    if offsets.shape != (n + 1,) or offsets.dtype != np.int64:
        raise DatasetError(
            f"{paths['offsets']}: shape {offsets.shape} dtype {offsets.dtype}, expected "
            f"({n + 1},) int64: one more than the split's {n} samples"
        )
    if int(offsets[0]) != 0 or int(offsets[-1]) != values.shape[0]:
        raise DatasetError(
            f"{paths['offsets']}: runs {int(offsets[0])}..{int(offsets[-1])}, expected "
            f"0..{values.shape[0]} (the length of {paths['values'].name})"
        )
    return MultiHotArrays(values=values, offsets=offsets)


def refuse_multi_hot(meta: Any, root: Path, what: str) -> None:
    """Stop ``what`` (training, partitioning) on a data set with multi-hot fields, which it
    would otherwise mis-read as single-hot only."""
    if meta.multi_hot:
        names = ", ".join(f.name for f in meta.multi_hot)
        raise DatasetError(
            f"{root}: {NOT_TRAINED_YET} ({what} cannot use this data set: it has multi-hot "
            f"fields {names}; `hetgmp dataset info {root}` describes them)"
        )
