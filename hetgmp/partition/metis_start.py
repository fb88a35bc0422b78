"""A METIS start: partition the sample <-> row bipartite graph (or a sample of it) with pymetis.

METIS minimises the edge cut under two balance constraints at once (vertex weights ``[1, 0]``
for samples and ``[0, 1]`` for rows), so samples AND rows come out even across parts.

METIS cannot take Criteo-scale graphs: its ``idx_t`` is 32-bit in the pymetis wheels (2^31
adjacency entries, while the Kaggle shape has 2 x 1.19 billion) and its memory is several times
the graph. Above ``max_edges`` edges we therefore partition the subgraph induced by a uniform
random sample of training samples (every row they use is kept), and leave the other samples and
rows at -1 for :class:`hetgmp._native.Refiner` to place greedily next to their neighbours. The
sample is uniform so that the hot rows, which dominate the cost, keep their true neighbourhood
structure; the long tail of rare rows is placed by the greedy pass, where METIS adds little.

Hot rows (see :func:`hot_degree_threshold`) are left out of the METIS graph: they sit in nearly every
batch of every worker whatever the placement, so they do not change the batch-aware cost, yet
they hold most edges of power-law data and would dominate the edge cut. On the 3.6M-sample
criteo-like set this took the METIS start from 142K to 94K expected fetches per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetgmp.native import native
from hetgmp.partition.sample_rows import SampleRows

DEFAULT_METIS_MAX_EDGES = 4_000_000
BALANCE_TOLERANCE = 0.03  # a METIS part may exceed the mean by 3 %; the surplus is re-placed


class MetisError(RuntimeError):
    """pymetis is missing or failed on the graph."""


def bipartite_csr(
    sub: np.ndarray, num_rows: int, threads: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """CSR of the undirected bipartite graph: vertices ``0..S-1`` samples, ``S..S+R-1`` rows.

    ``sub`` is an [S, F] matrix of row ids in ``[0, num_rows)``. Both directions are stored, as
    METIS requires; the sample side is the id matrix itself, the row side comes from the native
    counting sort (:func:`hetgmp._native.row_csr`).
    """
    s, f = sub.shape
    row_ptr, row_samples = native().row_csr(np.ascontiguousarray(sub), int(num_rows), int(threads))
    xadj = np.concatenate([np.arange(s, dtype=np.int64) * f, s * f + row_ptr])
    adjncy = np.concatenate([np.asarray(sub, dtype=np.int64).ravel() + s, row_samples])
    return xadj, adjncy


def hot_degree_threshold(num_samples: int, nparts: int, batch_size: int) -> float:
    """Rows used more often than this stay out of the METIS graph.

    With many batches per worker and epoch (B <= M/4), a row used by more than ~N/B samples
    sits in almost every batch of every worker holding a share of it: its placement hardly
    changes the batch-aware cost, but its edges dominate METIS's edge cut. With few batches
    per worker (B > M/4) the cost is all-or-nothing per (worker, row) and only rows that cannot
    fit in one worker (more than M = N/P uses) are left out. Measured on movielens-100k,
    criteo-sample and criteo-like: each rule is the better one in its own regime.
    """
    m = max(1, num_samples // nparts)
    return num_samples / batch_size if 4 * batch_size <= m else float(m)


def _sample_graph(
    sparse: np.ndarray | SampleRows,
    budget: int,
    rng: np.random.Generator,
    hot_degree: float | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A uniform sample of ``budget`` samples: (chosen, local row ids [S, F], rows, hot mask)."""
    n = sparse.shape[0]
    if n <= budget:
        chosen = np.arange(n, dtype=np.int64)
    else:
        chosen = np.sort(rng.choice(n, size=budget, replace=False))
    if isinstance(sparse, SampleRows):
        sub = sparse.padded(chosen)  # (-1 where a sample has fewer ids)
        valid = sub >= 0
        rows, inv, deg = np.unique(sub[valid], return_inverse=True, return_counts=True)
        local = np.full(sub.shape, -1, dtype=np.int64)
        local[valid] = inv
    else:
        sub = np.asarray(sparse[chosen], dtype=np.int64)
        rows, local, deg = np.unique(sub, return_inverse=True, return_counts=True)
        local = local.reshape(sub.shape).astype(np.int64)
    hot = np.zeros(rows.size, dtype=bool)
    if hot_degree is not None:
        # full-data degree estimated from the sample; hot rows are placed later, by use
        hot = deg * (n / chosen.size) > hot_degree
    return chosen, local, rows, hot


def ragged_bipartite_csr(local: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`bipartite_csr` for an [S, F] matrix whose -1 entries are left out (numpy)."""
    s, f = local.shape
    keep = local >= 0
    per_sample = keep.sum(axis=1)
    s_idx = np.repeat(np.arange(s, dtype=np.int64), per_sample)
    r_idx = local[keep]  # row-major: grouped by sample, in field order
    order = np.argsort(r_idx, kind="stable")
    per_row = np.bincount(r_idx, minlength=num_rows)
    xadj = np.concatenate([[0], np.cumsum(per_sample), per_sample.sum() + np.cumsum(per_row)])
    adjncy = np.concatenate([r_idx + s, s_idx[order]])
    return xadj.astype(np.int64), adjncy


def metis_start(
    sparse: np.ndarray | SampleRows,
    num_rows: int,
    nparts: int,
    *,
    seed: int = 0,
    max_edges: int = DEFAULT_METIS_MAX_EDGES,
    batch_size: int | None = None,
    threads: int = 0,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Partial placement from METIS: ``(data_partition, embed_partition, info)``, -1 = unplaced."""
    pymetis = _import_pymetis()
    n, f = sparse.shape
    data_part = np.full(n, -1, dtype=np.int32)
    embed_part = np.full(num_rows, -1, dtype=np.int32)
    if nparts == 1:
        data_part[:] = 0
        embed_part[:] = 0
        return data_part, embed_part, {"sampled_samples": n, "edge_cut": 0}
    chosen, local, rows, hot = _metis_sample(sparse, nparts, seed, max_edges, batch_size)
    s = chosen.size
    xadj, adjncy, rows = _metis_graph(local, rows, hot, threads)
    result = _part_graph(pymetis, nparts, xadj, adjncy, s, rows.size, seed)
    parts = np.asarray(result.vertex_part, dtype=np.int32)
    rng = np.random.default_rng([seed, 0xCA9])
    # METIS's multi-constraint balancing is loose on such lopsided graphs (e.g. 2x the mean
    # samples on criteo-sample); we cut every part back to the tolerance and let the greedy
    # pass re-place the surplus next to its neighbours.
    uncapped = {"samples": _cap(parts[:s], nparts, rng), "rows": _cap(parts[s:], nparts, rng)}
    data_part[chosen] = parts[:s]
    embed_part[rows] = parts[s:]
    info = {
        "sampled_samples": int(s),
        "sampled_fraction": float(s / n),
        "graph_vertices": int(s + rows.size),
        "graph_edges": int(adjncy.size // 2),
        "edge_cut": int(result.edge_cuts),
        "hot_rows_left_out": int(hot.sum()),
        "unplaced_over_balance": uncapped,
        "why": (
            "whole graph"
            if s == n
            else f"graph has {n * f} edges > --metis-max-edges {max_edges}: METIS on a uniform "
            f"sample of {s} samples, the rest placed greedily by their neighbours"
        ),
    }
    return data_part, embed_part, info


def _import_pymetis() -> Any:
    """The pymetis module, or :class:`MetisError` saying what to do without it."""
    try:
        import pymetis
    except ImportError as err:  # pragma: no cover - pymetis is a hard dependency
        raise MetisError(
            f"pymetis is not installed ({err}); install it or use --method refine/hash/random"
        ) from err
    return pymetis


def _metis_sample(
    sparse: np.ndarray | SampleRows,
    nparts: int,
    seed: int,
    max_edges: int,
    batch_size: int | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The samples METIS sees, as :func:`_sample_graph` returns them, within the edge budget.

    Both draws come from one generator, so the second (final) sample depends on the first:
    keep the two calls even when the budget does not grow (plans must stay reproducible).
    """
    n, f = sparse.shape
    budget = max(nparts, max_edges // max(1, f))
    rng = np.random.default_rng([seed, 0x3E715])
    hot_degree = None if batch_size is None else hot_degree_threshold(n, nparts, batch_size)
    chosen, local, rows, hot = _sample_graph(sparse, budget, rng, hot_degree)
    used = local >= 0
    kept = float((~hot[local[used]]).mean()) if used.any() else 1.0
    if chosen.size < n and kept < 0.8:
        # Hot rows hold most edges of power-law data; once they are left out, a larger sample
        # of training samples fits the same METIS edge budget.
        budget = int(min(n, budget / max(kept, 0.05)))
    return _sample_graph(sparse, budget, rng, hot_degree)


def _metis_graph(
    local: np.ndarray,
    rows: np.ndarray,
    hot: np.ndarray,
    threads: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR ``(xadj, adjncy)`` of the sampled graph without its hot rows, and the rows it keeps."""
    if not hot.any() and (local >= 0).all():
        xadj, adjncy = bipartite_csr(local, rows.size, threads)
        return xadj, adjncy, rows
    keep_rows = np.flatnonzero(~hot)
    relabel = np.full(rows.size + 1, -1, dtype=np.int64)  # (the extra -1: padding stays out)
    relabel[keep_rows] = np.arange(keep_rows.size)
    xadj, adjncy = ragged_bipartite_csr(relabel[local], keep_rows.size)
    return xadj, adjncy, rows[keep_rows]


def _part_graph(
    pymetis: Any,
    nparts: int,
    xadj: np.ndarray,
    adjncy: np.ndarray,
    s: int,
    r: int,
    seed: int,
) -> Any:
    """pymetis's result for ``s`` samples then ``r`` rows, balanced on both at once."""
    vweights = np.zeros((s + r, 2), dtype=np.int64)
    vweights[:s, 0] = 1
    vweights[s:, 1] = 1
    try:
        return pymetis.part_graph(
            nparts,
            adjacency=pymetis.CSRAdjacency(xadj, adjncy),
            vweights=vweights.ravel(),
            options=pymetis.Options(seed=int(seed)),
        )
    except Exception as err:  # pymetis raises plain RuntimeError/ValueError with METIS codes
        raise MetisError(
            f"METIS failed on a graph of {s + r} vertices / {adjncy.size // 2} edges: {err}"
        ) from err


def _cap(parts: np.ndarray, nparts: int, rng: np.random.Generator) -> int:
    """Mark (-1) a random surplus of every part above ``(1 + tolerance) x mean``; return count."""
    cap = int(np.ceil(parts.size / nparts * (1.0 + BALANCE_TOLERANCE)))
    sizes = np.bincount(parts, minlength=nparts)
    dropped = 0
    for p in np.flatnonzero(sizes > cap):
        members = np.flatnonzero(parts == p)
        surplus = rng.choice(members, size=int(sizes[p] - cap), replace=False)
        parts[surplus] = -1
        dropped += surplus.size
    return dropped
