"""Plans that need no graph partitioner: ``hash`` (classic model parallel) and ``random``.

Both are usable without METIS or the native extension, e.g. by the runtime when no plan file is
given. With ``sparse`` (the training ids) their mirror lists are ranked by the same priority as
partitioned plans, so mirroring can be compared fairly; without it the lists are empty.
"""

from __future__ import annotations

import numpy as np

from hetgmp.partition.plan import Plan, PlanError

DEFAULT_MAX_MIRROR_RATE = 0.25


def _check_sizes(num_samples: int, num_rows: int, nparts: int) -> None:
    if nparts < 1:
        raise PlanError(f"number of parts (-n) must be >= 1, got {nparts}")
    if num_samples < nparts:
        raise PlanError(
            f"cannot split {num_samples} training samples into {nparts} parts (-n): "
            "every worker needs at least one sample"
        )
    if num_rows < 1:
        raise PlanError(f"the data set has no embedding rows ({num_rows})")


def contiguous_shards(num_samples: int, nparts: int) -> np.ndarray:
    """Worker of every sample when samples are cut into ``nparts`` contiguous, near-equal shards.

    The first ``num_samples % nparts`` shards hold one sample more (``np.array_split``'s rule).
    """
    base, extra = divmod(num_samples, nparts)
    sizes = np.full(nparts, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.repeat(np.arange(nparts, dtype=np.int32), sizes)


def balanced_random(n: int, nparts: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random assignment of ``n`` items with part sizes differing by at most one."""
    out = np.empty(n, dtype=np.int32)
    out[rng.permutation(n)] = np.arange(n, dtype=np.int64) % nparts
    return out


def _finish(
    data_partition: np.ndarray,
    embed_partition: np.ndarray,
    nparts: int,
    method: str,
    seed: int | None,
    sparse: np.ndarray | None,
    batch_size: int,
    max_mirror_rate: float,
    topo: np.ndarray | None,
) -> Plan:
    meta: dict = {"method": method, "seed": seed, "batch_size": batch_size}
    if sparse is None:
        mirrors = [np.zeros(0, dtype=np.int64) for _ in range(nparts)]
        meta["mirrors"] = "none (no sample ids given)"
        return Plan(data_partition, embed_partition, mirrors, meta).validate()
    from hetgmp.partition.quality import rank_mirrors

    num_rows = int(embed_partition.shape[0])
    mirrors, _ = rank_mirrors(
        sparse,
        data_partition,
        embed_partition,
        nparts,
        batch_size=batch_size,
        topo=topo,
        max_mirror_rate=max_mirror_rate,
        num_rows=num_rows,
    )
    meta["max_mirror_rate"] = max_mirror_rate
    return Plan(data_partition, embed_partition, mirrors, meta).validate()


def hash_plan(
    num_samples: int,
    num_rows: int,
    nparts: int,
    *,
    sparse: np.ndarray | None = None,
    batch_size: int = 8192,
    max_mirror_rate: float = DEFAULT_MAX_MIRROR_RATE,
    topo: np.ndarray | None = None,
) -> Plan:
    """Row owner = ``id mod nparts``; samples in contiguous shards (the classic model-parallel layout)."""
    _check_sizes(num_samples, num_rows, nparts)
    data = contiguous_shards(num_samples, nparts)
    embed = (np.arange(num_rows, dtype=np.int64) % nparts).astype(np.int32)
    return _finish(data, embed, nparts, "hash", None, sparse, batch_size, max_mirror_rate, topo)


def random_plan(
    num_samples: int,
    num_rows: int,
    nparts: int,
    seed: int = 0,
    *,
    sparse: np.ndarray | None = None,
    batch_size: int = 8192,
    max_mirror_rate: float = DEFAULT_MAX_MIRROR_RATE,
    topo: np.ndarray | None = None,
) -> Plan:
    """Samples and rows each placed uniformly at random, balanced to within one item per part."""
    _check_sizes(num_samples, num_rows, nparts)
    rng = np.random.default_rng([seed, 0x5EED])
    data = balanced_random(num_samples, nparts, rng)
    embed = balanced_random(num_rows, nparts, rng)
    return _finish(data, embed, nparts, "random", seed, sparse, batch_size, max_mirror_rate, topo)
