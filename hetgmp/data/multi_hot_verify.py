"""Multi-hot fields in ``hetgmp dataset verify`` and ``hetgmp dataset info``.

Verify reads every offset and id of a field in chunks: offsets start at 0, never decrease and end
at the number of values; every id lies in the field's ``[offset, offset + cardinality)``. Info
prints, per field and split, what the writer recorded in ``meta.json``'s ``multi_hot_stats``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hetgmp.data.dataset_meta import DatasetMeta, FieldInfo
from hetgmp.data.multi_hot import MultiHotArrays, multi_hot_paths

_CHUNK = 1 << 20  # offsets / values per chunk while scanning


class _Report(Protocol):
    def good(self, msg: str) -> None: ...
    def bad(self, msg: str) -> None: ...


def _first_decrease(offsets: np.ndarray) -> int:
    """The first sample whose list ends before it starts, or -1."""
    n = offsets.shape[0] - 1
    for start in range(0, n, _CHUNK):
        part = np.asarray(offsets[start : start + _CHUNK + 1])
        down = np.flatnonzero(np.diff(part) < 0)
        if down.size:
            return start + int(down[0])
    return -1


def _bad_ids(values: np.ndarray, lo: int, hi: int) -> tuple[int, int, int]:
    """(how many ids fall outside ``[lo, hi)``, the first one's position, its value)."""
    count, first, val = 0, -1, 0
    for start in range(0, values.shape[0], _CHUNK):
        part = np.asarray(values[start : start + _CHUNK])
        out = np.flatnonzero((part < lo) | (part >= hi))
        if out.size:
            count += int(out.size)
            if first < 0:
                first, val = start + int(out[0]), int(part[out[0]])
    return count, first, val


def check_multi_hot(
    root: Path, split: str, k: int, field: FieldInfo, arrays: MultiHotArrays, rep: _Report
) -> None:
    """Check one multi-hot field of ``split`` end to end; failures name the file and sample."""
    paths = multi_hot_paths(root, split, k)
    offsets, values = arrays.offsets, arrays.values
    down = _first_decrease(offsets)
    if down >= 0:
        rep.bad(
            f"{paths['offsets'].name}: offsets decrease at sample {down} "
            f"({int(offsets[down])} -> {int(offsets[down + 1])}; multi-hot field {field.name})"
        )
        return
    lo, hi = field.offset, field.offset + field.cardinality
    count, first, val = _bad_ids(values, lo, hi)
    if count:
        sample = int(np.searchsorted(np.asarray(offsets), first, side="right")) - 1
        rep.bad(
            f"{paths['values'].name}: {count} ids of multi-hot field {field.name} outside "
            f"[{lo}, {hi}); first at value {first} (sample {sample}, id {val})"
        )
        return
    n = offsets.shape[0] - 1
    mean = values.shape[0] / n if n else 0.0
    rep.good(
        f"{paths['values'].name}: multi-hot field {field.name}, {n} samples, {values.shape[0]} "
        f"ids (mean length {mean:.2f}), offsets monotone, every id within [{lo}, {hi})"
    )


def _fmt(stat: dict[str, Any]) -> str:
    n = stat.get("samples") or 0
    mean = stat["values"] / n if n else 0.0
    return (
        f"{stat['values']} ids, length {stat['min_length']}..{stat['max_length']} "
        f"(mean {mean:.2f}), ids {stat['min_id']}..{stat['max_id']}"
    )


def describe_multi_hot(meta: DatasetMeta) -> list[str]:
    """``hetgmp dataset info`` lines for the multi-hot fields (none for a version-1 set)."""
    if not meta.multi_hot:
        return []
    lines = ["multi-hot    cardinality  offset  (per split: ids, list lengths, id range)"]
    for k, f in enumerate(meta.multi_hot):
        lines.append(f"  {f.name:<10} {f.cardinality:>11}  {f.offset}")
        for split, stats in sorted(meta.multi_hot_stats.items()):
            if k < len(stats) and stats[k]:
                lines.append(f"    {split:<8} {_fmt(stats[k])}")
    return lines
