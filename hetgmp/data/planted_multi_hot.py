"""Multi-hot fields of the criteo-like generator (``--multi-hot K:L``): lists with locality.

Each of the ``K`` fields draws, per sample, a list of ``1 .. 2L - 1`` ids (uniform, mean ``L``).
Every entry comes, with probability ``locality``, from the sample's user's *interests* (16 slots
per user and field, drawn once from the field's power law, used with equal weight: a user's
history repeats a few dozen items), otherwise from the field's global power law; both branches
have the same marginal distribution, as the single-hot fields' profiles. Ids may repeat within a
list (a user re-watching an item).

The planted logit gains, per field, the *mean* of the list's per-id weights (std
``MULTI_HOT_LOGIT_STD / sqrt(K)`` per id, tapered by the id's expected count like the single-hot
weights), so mean pooling can learn it; the true probabilities, and so ``best_auc``, include it.
All random numbers are counter hashes with salts of their own (20 and up): with ``K = 0`` nothing
here runs and the data set is byte-identical to one made without the option.

``--communities C`` gives the lists community structure (:mod:`hetgmp.data.planted_communities`):
each draw above, an interest slot's or a fresh entry's, comes from the user's community's power
law over its own slice of the catalogue, or with probability ``--community-global`` from the
global law. The label model is the same mean of per-id weights (their taper follows the items'
new frequencies), so ``best_auc`` stays the exact AUC of the true probabilities. With ``C = 0``
(the default) none of that runs and the lists are byte-identical to those made before it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from hetgmp.data.counter_hash import GOLDEN, hash_uniform, mix, salt
from hetgmp.data.generate_config import GenerateError, parse_multi_hot
from hetgmp.data.planted_communities import CommunityLaw, build_communities, community_shares
from hetgmp.data.planted_model import LEARNABLE_COUNT, PowerLaw

MULTI_HOT_BASE_CARDINALITY = 1_000_000  # x scale (min 2): an item catalogue
MULTI_HOT_EXPONENT = 1.1
INTEREST_SLOTS = 16
MULTI_HOT_LOGIT_STD = 1.0


@dataclasses.dataclass
class MultiHotModel:
    """The multi-hot fields' layout, power law and per-id label weights."""

    cards: np.ndarray  # int64 [K]
    offsets: np.ndarray  # int64 [K]: global offsets (after the single-hot fields)
    mean_length: int
    ids: PowerLaw  # one component: every multi-hot field has the same cardinality and law
    weights: list[np.ndarray]  # per field, float32 [card], by local id
    locality: float
    seed: int
    communities: CommunityLaw | None = None  # --communities; None: the one global law

    @property
    def count(self) -> int:
        return int(self.cards.shape[0])


def build_multi_hot(
    spec: str,
    scale: float,
    locality: float,
    seed: int,
    num_train: int,
    first_offset: int,
    *,
    communities: int = 0,
    global_share: float = 0.0,
    user_pmf: np.ndarray | None = None,
) -> MultiHotModel | None:
    """The model of ``spec``'s fields (None for none), ids starting at ``first_offset``.

    ``communities`` > 0 draws the lists from that many communities' laws (``global_share`` of
    the draws from the global one); ``user_pmf``, the users' share of samples, weighs them."""
    k, length = parse_multi_hot(spec)
    if not k:
        if communities:
            raise GenerateError("--communities needs --multi-hot K:L (the lists it shapes)")
        return None
    card = max(2, int(round(MULTI_HOT_BASE_CARDINALITY * scale)))
    cards = np.full(k, card, dtype=np.int64)
    offsets = first_offset + np.arange(k, dtype=np.int64) * card
    ids = PowerLaw(np.array([card]), np.array([MULTI_HOT_EXPONENT]))  # (the same for each)
    law, pmf = None, ids.pmf(0)  # (without communities rank r is local id r: no permutation)
    if communities:
        if communities > card:
            raise GenerateError(
                f"--communities {communities} is more than the multi-hot catalogue's {card} "
                f"items at --scale {scale}: every community needs an item of its own"
            )
        law = build_communities(communities, card, global_share, MULTI_HOT_EXPONENT, seed)
        shares = (
            np.full(communities, 1.0 / communities)
            if user_pmf is None
            else community_shares(user_pmf, communities)
        )
        pmf = law.item_pmf(shares)
    weights = []
    for f in range(k):
        count = pmf * num_train * length
        taper = count / (count + LEARNABLE_COUNT)
        g = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 20, f])))
        sd = MULTI_HOT_LOGIT_STD / math.sqrt(k)
        weights.append((g.standard_normal(card) * sd * taper).astype(np.float32))
    return MultiHotModel(cards, offsets, length, ids, weights, locality, seed, law)


def multi_hot_bags(
    mm: MultiHotModel, start: int, n: int, user: np.ndarray
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Samples ``start .. start+n-1``'s lists (global ids, offsets) and their logit term."""
    s, logit, bags = mm.seed, np.zeros(n), []
    idx = np.arange(start, start + n, dtype=np.uint64)
    for f in range(mm.count):
        fk = np.uint64(f)
        u_len = hash_uniform((idx * np.uint64(mm.count) + fk) ^ salt(s, 21))
        lengths = 1 + (u_len * (2 * mm.mean_length - 1)).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        owner = np.repeat(np.arange(n), lengths)
        pos = (np.arange(offsets[-1]) - offsets[owner]).astype(np.uint64)
        # One hash per entry: profile-vs-global coin (high bits) and the interest slot (low).
        entry = (idx[owner] * np.uint64(32768) + pos) * np.uint64(mm.count) + fk
        h = mix(entry * GOLDEN + salt(s, 22))
        coin = (h >> np.uint64(32)).astype(np.float64) * (1.0 / 4294967296.0)
        slot = (h & np.uint64(0xFFFFFFFF)) % np.uint64(INTEREST_SLOTS)
        interest = (user[owner] * np.uint64(INTEREST_SLOTS) + slot) * np.uint64(mm.count) + fk
        key = np.where(coin < mm.locality, interest ^ salt(s, 23), entry ^ salt(s, 24))
        if mm.communities is None:
            local = mm.ids.ranks(hash_uniform(key)[:, None])[:, 0]
        else:  # (the user's community: users are numbered by activity, dealt round-robin)
            local = mm.communities.draw(key, user[owner] % np.uint64(mm.communities.count))
        sums = np.bincount(owner, weights=mm.weights[f][local], minlength=n)
        logit += sums / lengths
        bags.append((local + mm.offsets[f], offsets))
    return bags, logit
