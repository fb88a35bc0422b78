"""Plan quality: expected fetches per step, mirror ranking, and the report stored in ``meta``.

The heavy counting runs in the native extension (``hetgmp._native``); :mod:`hetgmp.partition.cost`
holds the numpy reference that tests compare it against.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetgmp.partition import cost as costmod
from hetgmp.partition.sample_rows import SampleRows, native_args

REPORT_STORE_RATES = (0.001, 0.01, 0.1)


def _native():
    from hetgmp.native import native

    return native()


def _ids(sparse: np.ndarray | SampleRows) -> tuple[np.ndarray, np.ndarray | None]:
    """The sample ids as a C-contiguous int32/int64 array (memmaps pass through untouched) and
    the ragged offsets (None for the [N, F] matrix)."""
    if isinstance(sparse, SampleRows):
        return native_args(sparse)
    arr = np.asarray(sparse)
    if arr.dtype not in (np.int32, np.int64):
        arr = arr.astype(np.int64)
    return np.ascontiguousarray(arr), None


def usage_counts(
    sparse: np.ndarray | SampleRows,
    data_partition: np.ndarray,
    nparts: int,
    num_rows: int,
    threads: int = 0,
) -> np.ndarray:
    """``counts[r, p]`` (int32 [num_rows, nparts]) computed natively."""
    dp = np.ascontiguousarray(data_partition, dtype=np.int32)
    ids, offsets = _ids(sparse)
    return _native().usage_counts(
        ids, dp, int(nparts), int(num_rows), int(threads), offsets=offsets
    )


def rank_mirrors(
    sparse: np.ndarray | SampleRows,
    data_partition: np.ndarray,
    embed_partition: np.ndarray,
    nparts: int,
    *,
    batch_size: int,
    topo: np.ndarray | None,
    max_mirror_rate: float,
    num_rows: int,
    counts: np.ndarray | None = None,
    threads: int = 0,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per worker: non-owned rows by descending mirror priority, and each one's saved fetches/step.

    Lists are truncated to ``max_mirror_rate * num_rows`` entries.
    """
    if topo is None:
        topo = costmod.topology_matrix(nparts)
    if counts is None:
        counts = usage_counts(sparse, data_partition, nparts, num_rows, threads)
    m = costmod.samples_per_part(int(np.asarray(data_partition).shape[0]), nparts)
    limit = int(round(max_mirror_rate * num_rows))
    ep = np.ascontiguousarray(embed_partition, dtype=np.int32)
    ids, gains = _native().rank_mirrors(
        counts,
        ep,
        np.ascontiguousarray(topo, dtype=np.float64),
        int(m),
        int(batch_size),
        int(limit),
        int(threads),
    )
    return list(ids), list(gains)


def quality_report(
    sparse: np.ndarray | SampleRows,
    data_partition: np.ndarray,
    embed_partition: np.ndarray,
    nparts: int,
    *,
    batch_size: int,
    topo: np.ndarray,
    num_rows: int,
    counts: np.ndarray | None = None,
    mirror_gains: list[np.ndarray] | None = None,
    threads: int = 0,
) -> dict[str, Any]:
    """Per-worker samples, rows, expected remote fetches per step without and with mirrors."""
    if counts is None:
        counts = usage_counts(sparse, data_partition, nparts, num_rows, threads)
    n = int(np.asarray(data_partition).shape[0])
    m = costmod.samples_per_part(n, nparts)
    ep = np.ascontiguousarray(embed_partition, dtype=np.int32)
    fetches = _native().fetch_matrix(counts, ep, int(m), int(batch_size), int(threads))
    if mirror_gains is None:
        _, mirror_gains = rank_mirrors(
            sparse,
            data_partition,
            ep,
            nparts,
            batch_size=batch_size,
            topo=topo,
            max_mirror_rate=max(REPORT_STORE_RATES),
            num_rows=num_rows,
            counts=counts,
            threads=threads,
        )
    remote = fetches.copy()
    np.fill_diagonal(remote, 0.0)
    per_worker_fetch = remote.sum(axis=1)
    samples = np.bincount(np.asarray(data_partition, dtype=np.int64), minlength=nparts)
    rows = np.bincount(ep.astype(np.int64), minlength=nparts)
    serve = remote.sum(axis=0)
    workers, totals = _worker_entries(
        samples, rows, per_worker_fetch, serve, mirror_gains, num_rows
    )
    return {
        "batch_size": int(batch_size),
        "samples_per_part": int(m),
        "fetches_per_step": float(per_worker_fetch.sum()),
        "weighted_cost_per_step": costmod.total_cost(fetches, topo),
        "fetches_per_step_with_store_rate": totals,
        "max_over_mean": {
            "samples": _spread(samples),
            "rows": _spread(rows),
            "serves": _spread(serve),
        },
        "workers": workers,
    }


def _worker_entries(
    samples: np.ndarray,
    rows: np.ndarray,
    fetches: np.ndarray,
    serves: np.ndarray,
    mirror_gains: list[np.ndarray],
    num_rows: int,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Each worker's report entry, and the fetches per step summed over workers per store rate.

    With store rate ``s`` a worker mirrors its ``s * num_rows`` best non-owned rows, which save
    the cumulative sum of their gains (never below zero fetches).
    """
    workers = []
    totals = {str(s): 0.0 for s in REPORT_STORE_RATES}
    for w in range(samples.size):
        entry: dict[str, Any] = {
            "samples": int(samples[w]),
            "rows": int(rows[w]),
            "fetches": float(fetches[w]),
            "serves": float(serves[w]),
        }
        cum = np.concatenate([[0.0], np.cumsum(mirror_gains[w], dtype=np.float64)])
        for s in REPORT_STORE_RATES:
            k = min(int(round(s * num_rows)), cum.size - 1)
            val = max(0.0, float(fetches[w] - cum[k]))
            entry[f"fetches_store_{s}"] = val
            totals[str(s)] += val
        workers.append(entry)
    return workers, totals


def _spread(x: np.ndarray) -> float:
    """Max over mean (1.0 for an all-zero vector): how uneven a per-worker quantity is."""
    mean = float(np.mean(x))
    return float(np.max(x) / mean) if mean > 0 else 1.0


def summary_line(name: str, rep: dict[str, Any]) -> str:
    """One parseable line: method, total fetches per step, with mirrors, balance."""
    s = rep["fetches_per_step_with_store_rate"]
    b = rep["max_over_mean"]
    return (
        f"{name}: fetches/step={rep['fetches_per_step']:.1f} "
        f"cost/step={rep['weighted_cost_per_step']:.1f} "
        + " ".join(f"store{k}={v:.1f}" for k, v in s.items())
        + f" balance samples={b['samples']:.3f} rows={b['rows']:.3f} serves={b['serves']:.3f}"
    )
