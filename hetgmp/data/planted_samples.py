"""Samples of the criteo-like generator: ids, dense features, logits and labels of a chunk.

Each is a pure function of the planted model and the sample index (see
:mod:`hetgmp.data.counter_hash`), so chunks can be made in any order and on any thread.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hetgmp.data.counter_hash import GOLDEN, hash_uniform, mix, salt
from hetgmp.data.planted_model import NUM_DENSE, PROFILE_SLOT_WEIGHTS, PlantedModel
from hetgmp.data.planted_multi_hot import multi_hot_bags


@dataclasses.dataclass
class Chunk:
    """Generated samples ``[start, start + n)``: local ids, dense, logits (without bias)."""

    start: int
    local: np.ndarray  # int64 [n, F], id within the field
    dense: np.ndarray  # float32 [n, NUM_DENSE]
    logit: np.ndarray  # float64 [n], without the bias
    # per multi-hot field, (global ids, offsets [n + 1]); none without --multi-hot
    bags: list[tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list)


def sample_users(m: PlantedModel, start: int, n: int) -> np.ndarray:
    """Latent user (int64) of samples ``start .. start+n-1`` (not stored in the data set)."""
    idx = np.arange(start, start + n, dtype=np.uint64)
    return m.users.ranks(hash_uniform(idx + salt(m.seed, 10))[:, None])[:, 0]


def generate_chunk(m: PlantedModel, start: int, n: int) -> Chunk:
    """Samples ``start .. start+n-1``; a pure function of (model, sample index)."""
    s = m.seed
    idx = np.arange(start, start + n, dtype=np.uint64)
    user = sample_users(m, start, n).astype(np.uint64)
    nf = m.num_fields
    fields = np.arange(nf, dtype=np.uint64)
    # One hash per (sample, field) decides profile-vs-global and the profile slot.
    h = mix((idx[:, None] * np.uint64(nf) + fields) * GOLDEN + salt(s, 11))
    coin = (h >> np.uint64(32)).astype(np.float64) * (1.0 / 4294967296.0)
    slot_u = (h & np.uint64(0xFFFFFFFF)).astype(np.float64) * (1.0 / 4294967296.0)
    cum = np.cumsum(PROFILE_SLOT_WEIGHTS) / sum(PROFILE_SLOT_WEIGHTS)
    slot = np.searchsorted(cum, slot_u, side="right").astype(np.uint64)
    k = np.uint64(len(PROFILE_SLOT_WEIGHTS))
    profile_key = ((user[:, None] * k + slot) * np.uint64(nf) + fields) ^ salt(s, 12)
    global_key = (idx[:, None] * np.uint64(nf) + fields) ^ salt(s, 13)
    key = np.where(coin < m.locality, profile_key, global_key)
    rank = m.ids.ranks(hash_uniform(key))
    local = (rank * m.perm_mul + m.perm_add) % m.cards

    # Dense: skewed count-like values, log-transformed like Criteo's integers; the user scales them.
    activity = 0.5 + hash_uniform(user + salt(s, 14))
    du = hash_uniform(
        (idx[:, None] * np.uint64(NUM_DENSE) + np.arange(NUM_DENSE, dtype=np.uint64)) ^ salt(s, 15)
    )
    dense = np.log1p(-np.log1p(-du) * m.dense_mu * activity[:, None])

    logit = m.weights[local + m.offsets].astype(np.float64).sum(axis=1)
    for a, b in m.pairs:
        logit += np.einsum("ij,ij->i", m.factors[a][local[:, a]], m.factors[b][local[:, b]])
    logit += dense @ m.dense_beta
    bags: list[tuple[np.ndarray, np.ndarray]] = []
    if m.multi_hot is not None:
        bags, pooled = multi_hot_bags(m.multi_hot, start, n, user)
        logit += pooled
    return Chunk(start=start, local=local, dense=dense.astype(np.float32), logit=logit, bags=bags)


def solve_bias(logits: np.ndarray, target: float) -> float:
    """The ``b`` with ``mean(sigmoid(b + logits)) == target`` (bisection; monotone in b)."""
    lo, hi = -30.0, 30.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if _sigmoid(mid + logits).mean() < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def labels_and_probs(m: PlantedModel, c: Chunk) -> tuple[np.ndarray, np.ndarray]:
    """True probabilities (float32) and labels drawn from them (hash of the sample index)."""
    p = _sigmoid(m.bias + c.logit).astype(np.float32)
    idx = np.arange(c.start, c.start + c.local.shape[0], dtype=np.uint64)
    u = hash_uniform(idx ^ salt(m.seed, 16))
    return (u < p).astype(np.float32), p
