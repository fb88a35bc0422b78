"""The host tier's first residents (``--rows-on host --cache-warm counts``, issue 33): how
often each row occurs in the training split, so that each rank's device cache starts with its
most used owned rows (:func:`hetgmp.embedding.tiered.hottest_first`) instead of the lowest
ids. Owners serve every rank's reads of their rows, so the counts are over the whole split,
not a rank's shard; one pass over its ids in chunks (a memory-mapped split is read once)."""

from __future__ import annotations

import numpy as np

from hetgmp.data.format import Dataset
from hetgmp.embedding.tier_host import SetupClock
from hetgmp.train.config import TrainConfig
from hetgmp.train.runlog import RunLog

CHUNK_SAMPLES = 1 << 18  # samples counted at a time (bounds the temporary int64 ids)


def warm_counts(cfg: TrainConfig, ds: Dataset, log: RunLog | None = None) -> np.ndarray | None:
    """Per-row occurrence counts of the training split (int64 ``[num_rows]``) where the host
    tier starts warm, else None (rows on the device, ``--cache-warm cold``, or a cache of the
    whole table: nothing to choose)."""
    if cfg.rows_on != "host" or cfg.cache_warm != "counts" or cfg.cache_budget >= 1.0:
        return None
    n = ds.meta.num_embeddings
    sparse = ds.train.sparse
    counts = np.zeros(n, np.int64)
    with SetupClock(None if log is None else log.info).phase("count", rows=n) as line:
        for a in range(0, sparse.shape[0], CHUNK_SAMPLES):  # (one bincount per chunk)
            ids = np.asarray(sparse[a : a + CHUNK_SAMPLES]).reshape(-1).astype(np.int64)
            counts += np.bincount(ids[(ids >= 0) & (ids < n)], minlength=n)
        line["ids"] = int(counts.sum())
    if log is not None:
        log.info(
            f"host tier: each rank's cache starts with its most used rows ({int(counts.sum()):,} "
            f"ids of the training split counted; --cache-warm cold: the lowest ids)"
        )
    return counts
