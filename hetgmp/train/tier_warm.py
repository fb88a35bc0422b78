"""The host tier's training-side settings (issue 33): the exchange ``--exchange auto`` takes
with it (:func:`exchange_of`), and its first residents (``--cache-warm counts``): how
often each row occurs in the training split, so that each rank's device cache starts with its
most used owned rows (:func:`hetgmp.embedding.tiered.hottest_first`) instead of the lowest
ids. Owners serve every rank's reads of their rows, so the counts are over the whole split,
not a rank's shard; one pass over its ids in chunks (a memory-mapped split is read once)."""

from __future__ import annotations

from typing import Any

import numpy as np

from hetgmp.comm.env import DistEnv
from hetgmp.data.format import Dataset
from hetgmp.embedding.tier_host import SetupClock
from hetgmp.embedding.tier_setup import check_owned_flow
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


def exchange_of(cfg: TrainConfig, env: DistEnv) -> str:
    """``--exchange`` for the table: ``auto`` with several CUDA ranks' host tier takes the
    padded exchange where the whole step may be one graph (the trainer goes back to exact
    before the first step where it is not: ``Trainer.open_source``); the table's own ``auto``
    takes exact there (an API user's eager steps never make the peers' rows resident)."""
    several_cuda = env.world_size > 1 and env.device.type == "cuda"
    # (padded needs every reply: --replies auto gives that on NCCL only)
    all_replies = cfg.replies == "all" or (cfg.replies == "auto" and env.backend == "nccl")
    if cfg.exchange == "auto" and cfg.rows_on == "host" and several_cuda and cfg.cuda_graphs:
        return "padded" if cfg.sync == "collective" and all_replies else "auto"
    return cfg.exchange


def settle_exchange(table: Any, cfg: TrainConfig, whole_step: bool, log: RunLog) -> None:
    """(Before the first step) where the whole step does not apply (``whole_step`` False),
    the padded exchange that ``--exchange auto`` gave several ranks' host tier
    (:func:`exchange_of`) traded for the exact one, said in the log; then the flow check
    (the padded exchange with a tier outside the whole step is refused)."""
    if not whole_step and cfg.exchange == "auto" and getattr(table, "owned", None) is not None:
        table.use_exact_exchange()
        log.info("exchange: exact after all (the host tier's padded one needs the whole step)")
    check_owned_flow(table, whole_step)
