"""Communities of the generator's multi-hot fields (``--communities C``): histories with
community structure, what graph partitioning exploits in real click logs.

Without communities every user's interests come from the catalogue's one global power law, so
the popular items sit in most users' histories and no placement makes their rows local
(``bench/results/multi_hot_partition.md``, the first run). With ``C`` communities:

* user ``u`` belongs to community ``u % C``. Users are numbered by activity rank, so the busy
  ones are dealt round-robin and the communities get about the same share of samples. The
  community is a property of the user, whose single-hot profile ids (``locality``) follow the
  user too, so a sample's single-hot rows and its lists' rows gather around the same users.
* community ``c`` owns a slice of each multi-hot field's catalogue, the items ``c + C * r`` for
  ``r < card // C`` (the ``card % C`` items left over are reached by global draws only), with a
  power law of its own over the slice (exponent ``MULTI_HOT_EXPONENT``): an item popular in one
  community is unknown to the others.
* a share ``global_share`` of the draws comes instead from the global power law over the whole
  catalogue (ranks mapped to items by an affine permutation, so the global hits are spread over
  the slices): the few items popular everywhere.

Every draw, an interest slot's or a fresh entry's, is this mixture, so the locality knob still
changes only how often a user repeats, not the items' frequencies. Random numbers are counter
hashes of the same keys as without communities plus salt 25 (the global-vs-community coin).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from hetgmp.data.counter_hash import hash_uniform, salt
from hetgmp.data.planted_model import PowerLaw


@dataclasses.dataclass
class CommunityLaw:
    """Where a multi-hot field's ids come from under ``--communities``: per community, a power
    law over its slice of the catalogue, mixed with a global one."""

    count: int  # C communities
    card: int  # catalogue size (every multi-hot field has the same)
    global_share: float
    glob: PowerLaw  # over [0, card), ranks -> items by (rank * mul + add) % card
    comm: PowerLaw  # over [0, card // C), the same for every community; rank r -> c + C * r
    mul: int
    add: int
    coin_salt: np.uint64

    @property
    def slice_size(self) -> int:
        return self.card // self.count

    def draw(self, key: np.ndarray, community: np.ndarray) -> np.ndarray:
        """Items (local ids, int64) for hash ``key``s (uint64) of users in ``community``."""
        u = hash_uniform(key)[:, None]
        coin = hash_uniform(key ^ self.coin_salt)
        item_g = (self.glob.ranks(u)[:, 0] * self.mul + self.add) % self.card
        item_c = community.astype(np.int64) + self.count * self.comm.ranks(u)[:, 0]
        return np.where(coin < self.global_share, item_g, item_c)

    def item_pmf(self, community_shares: np.ndarray) -> np.ndarray:
        """Each item's probability in one draw (float64 [card]), users' communities weighted by
        ``community_shares`` (their share of samples, summing to 1)."""
        p = np.zeros(self.card)
        items = (np.arange(self.card, dtype=np.int64) * self.mul + self.add) % self.card
        p[items] = self.global_share * self.glob.pmf(0)
        n = self.slice_size
        grid = np.arange(self.count)[:, None] + self.count * np.arange(n)[None, :]  # [C, n]
        p[grid] += (1.0 - self.global_share) * community_shares[:, None] * self.comm.pmf(0)[None]
        return p

    def in_community(self, items: np.ndarray, community: np.ndarray) -> np.ndarray:
        """Whether each item lies in the slice of its user's community (bool)."""
        return (items % self.count == community) & (items < self.count * self.slice_size)


def build_communities(
    count: int, card: int, global_share: float, exponent: float, seed: int
) -> CommunityLaw:
    """The law of ``count`` communities over a catalogue of ``card`` items (``count <= card``)."""
    r = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 25])))
    mul = 1
    while card > 2:  # an affine permutation: a multiplier coprime to the catalogue's size
        mul = int(r.integers(1, card))
        if math.gcd(mul, card) == 1:
            break
    add = int(r.integers(0, card))
    glob = PowerLaw(np.array([card]), np.array([exponent]))
    comm = PowerLaw(np.array([card // count]), np.array([exponent]))
    return CommunityLaw(count, card, global_share, glob, comm, mul, add, salt(seed, 25))


def community_shares(user_pmf: np.ndarray, count: int) -> np.ndarray:
    """Each community's share of samples: the activity of its users ``u % count == c``."""
    users = np.arange(user_pmf.shape[0])
    return np.bincount(users % count, weights=user_pmf, minlength=count)
