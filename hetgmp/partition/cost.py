"""The batch-aware communication cost model, in plain numpy (the reference for the native code).

A worker trains on its ``M`` samples in batches of ``B``. A row that ``k`` of the worker's samples
use is fetched once per *batch* that touches it, not once per sample: with samples drawn in a
random order, a batch touches it with probability ``1 - (1 - k/M)^B`` (HET-GMP's "soft count",
here in units of fetches per step). ``M`` is ``num_samples // nparts`` for every worker, as in
HET-GMP, so the cost of one worker does not change when another worker's sample count moves.

Remote fetches are weighted by a topology matrix ``cost[i, j]`` (worker i reading a row owned by
worker j): 0 on the diagonal, ``intra_cost`` between GPUs of one node, 1 across nodes.

Everything here is O(edges) numpy and is used by tests to check the C++ loops, and by the plan
report for small data sets.
"""

from __future__ import annotations

import numpy as np

DEFAULT_INTRA_COST = 0.1  # NVLink/PCIe inside a node vs the network: HET-GMP's experiments use 0.1


class CostModelError(ValueError):
    """Invalid cost-model parameters (batch size, topology)."""


def samples_per_part(num_samples: int, nparts: int) -> int:
    """``M``: the nominal samples of one worker (HET-GMP's ``n_data / n_part``), at least 1."""
    return max(1, num_samples // nparts)


def soft_count(k: np.ndarray | int, m: int, batch_size: int) -> np.ndarray:
    """Expected fetches per step of a row used by ``k`` of a worker's ``m`` samples."""
    if batch_size < 1:
        raise CostModelError(f"batch size must be >= 1, got {batch_size}")
    k = np.asarray(k, dtype=np.float64)
    frac = np.clip(1.0 - k / float(m), 0.0, 1.0)
    return 1.0 - frac**batch_size


def topology_matrix(
    nparts: int, *, gpus_per_node: int | None = None, intra_cost: float = DEFAULT_INTRA_COST
) -> np.ndarray:
    """Cost of one remote row fetch between workers: 0 same worker, ``intra_cost`` same node, 1 else.

    ``gpus_per_node=None`` means every worker is its own node (HET-GMP's all-ones topology).
    """
    if nparts < 1:
        raise CostModelError(f"number of parts must be >= 1, got {nparts}")
    if not 0.0 <= intra_cost <= 1.0:
        raise CostModelError(f"--intra-cost must lie in [0, 1], got {intra_cost}")
    g = 1 if gpus_per_node is None else int(gpus_per_node)
    if g < 1:
        raise CostModelError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    node = np.arange(nparts) // g
    mat = np.where(node[:, None] == node[None, :], intra_cost, 1.0)
    np.fill_diagonal(mat, 0.0)
    return mat.astype(np.float64)


def usage_counts(
    sparse: np.ndarray, data_partition: np.ndarray, nparts: int, num_rows: int, chunk: int = 1 << 18
) -> np.ndarray:
    """``counts[r, p]``: how many of worker p's samples use row r (int64 [num_rows, nparts])."""
    counts = np.zeros(num_rows * nparts, dtype=np.int64)
    for start in range(0, sparse.shape[0], chunk):
        ids = np.asarray(sparse[start : start + chunk], dtype=np.int64)
        part = np.asarray(data_partition[start : start + chunk], dtype=np.int64)
        counts += np.bincount((ids * nparts + part[:, None]).ravel(), minlength=num_rows * nparts)
    return counts.reshape(num_rows, nparts)


def fetch_matrix(
    counts: np.ndarray, embed_partition: np.ndarray, m: int, batch_size: int
) -> np.ndarray:
    """``F[i, j]``: expected rows per step worker i fetches from owner j (diagonal = local reads)."""
    num_rows, nparts = counts.shape
    soft = soft_count(counts, m, batch_size)  # [R, P]
    out = np.zeros((nparts, nparts), dtype=np.float64)
    owner = np.asarray(embed_partition, dtype=np.int64)
    for i in range(nparts):
        out[i] = np.bincount(owner, weights=soft[:, i], minlength=nparts)
    return out


def total_cost(fetches: np.ndarray, topo: np.ndarray) -> float:
    """Topology-weighted expected remote fetches per step, summed over workers."""
    return float((fetches * topo).sum())


def mirror_ranking(
    counts: np.ndarray,
    embed_partition: np.ndarray,
    worker: int,
    m: int,
    batch_size: int,
    topo: np.ndarray,
    limit: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows worker ``worker`` does not own, best mirror first, with their saved fetches per step.

    Priority = fetches per step a local copy avoids, weighted by topology
    (``topo[worker, owner] * soft_count(k)``); ties go to the larger use count, then the lower id.
    Rows the worker never uses are not listed (a copy would save nothing).
    Returns ``(row_ids int64, unweighted_saved_fetches float64)`` in priority order.
    """
    owner = np.asarray(embed_partition, dtype=np.int64)
    k = counts[:, worker]
    cand = np.flatnonzero((owner != worker) & (k > 0))
    soft = soft_count(k[cand], m, batch_size)
    gain = soft * topo[worker, owner[cand]]
    order = np.lexsort((cand, -k[cand], -gain))
    if limit is not None:
        order = order[:limit]
    return cand[order].astype(np.int64), soft[order]
