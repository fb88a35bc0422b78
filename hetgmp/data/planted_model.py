"""The planted model of the criteo-like generator: field layout, power laws and label weights.

See :mod:`hetgmp.data.generate` for what the model is and how its constants were calibrated.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from hetgmp.data.generate_config import CriteoLikeConfig

CRITEO_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
# Power-law exponent per field, fitted to distinct-value counts of criteo-sample (see hetgmp.data.generate).
CRITEO_ZIPF_EXPONENTS: tuple[float, ...] = (
    1.98, 1.48, 1.04, 1.10, 2.61, 3.00, 0.98, 2.32, 1.00, 1.12, 1.06, 1.05, 1.05,
    3.00, 1.16, 1.07, 1.00, 1.29, 1.52, 1.00, 1.06, 3.00, 3.00, 1.19, 2.85, 1.25,
)  # fmt: skip
NUM_DENSE = 13
USER_ACTIVITY_EXPONENT = 0.7  # Gini 0.47 of samples per user, as movielens-100k
PROFILE_SLOT_WEIGHTS = (8.0, 4.0, 2.0, 1.0)
INTERACTION_RANK = 4
NUM_INTERACTION_PAIRS = 8
INTERACTION_MAX_CARD = 20_000  # interactions only between fields with this many values at most
# Logit budget. Most of the signal is first-order, as in real CTR logs (on Criteo, a tuned
# logistic regression is within ~0.015 AUC of the best deep models); interactions add ~0.02.
ID_LOGIT_STD = 1.3
INTERACTION_LOGIT_STD = 0.4
LEARNABLE_COUNT = 100.0  # expected count at which an id's weight reaches half its full scale


# ----------------------------------------------------------------------------- power laws


@dataclasses.dataclass
class PowerLaw:
    """Bounded continuous power law over ranks ``[0, n)``, binned: P(rank) ~ (rank + 1) ** -a."""

    n: np.ndarray  # int64 [K] support sizes
    a: np.ndarray  # float64 [K] exponents (never exactly 1)

    def __post_init__(self) -> None:
        self.a = np.where(np.abs(self.a - 1.0) < 1e-3, 1.001, self.a).astype(np.float64)
        self.n = np.asarray(self.n, dtype=np.int64)
        self._c = np.power(self.n + 1.0, 1.0 - self.a) - 1.0
        self._inv = 1.0 / (1.0 - self.a)

    def ranks(self, u: np.ndarray) -> np.ndarray:
        """Inverse CDF: uniforms ``u`` (broadcasting over the last axis = component) to ranks."""
        x = np.exp(np.log1p(u * self._c) * self._inv)
        r = x.astype(np.int64) - 1
        return np.clip(r, 0, self.n - 1)

    def pmf(self, k: int) -> np.ndarray:
        """Probabilities of all ranks of component ``k`` (float64 [n_k])."""
        r = np.arange(int(self.n[k]) + 1, dtype=np.float64) + 1.0
        cdf = (np.power(r, 1.0 - self.a[k]) - 1.0) / self._c[k]
        return np.diff(cdf)


def expected_distinct(p: np.ndarray, draws: float) -> float:
    """Expected number of distinct values in ``draws`` independent draws from pmf ``p``."""
    return float((-np.expm1(draws * np.log1p(-np.minimum(p, 1 - 1e-15)))).sum())


def _coprime_multiplier(n: int, rng: np.random.Generator) -> int:
    if n <= 2:
        return 1
    while True:
        m = int(rng.integers(1, n))
        if math.gcd(m, n) == 1:
            return m


# ----------------------------------------------------------------------------- the model


@dataclasses.dataclass
class PlantedModel:
    """Everything that defines the distribution: field layout, power laws, label weights."""

    cards: np.ndarray  # int64 [F]
    offsets: np.ndarray  # int64 [F]
    ids: PowerLaw
    users: PowerLaw
    perm_mul: np.ndarray  # int64 [F]: id = (rank * mul + add) % card
    perm_add: np.ndarray
    weights: np.ndarray  # float32 [R], per global id
    pairs: list[tuple[int, int]]
    factors: dict[int, np.ndarray]  # field -> float32 [card, INTERACTION_RANK]
    dense_mu: np.ndarray  # float64 [NUM_DENSE]
    dense_beta: np.ndarray  # float64 [NUM_DENSE]
    bias: float
    locality: float
    num_users: int
    seed: int
    # --multi-hot's fields: a hetgmp.data.planted_multi_hot.MultiHotModel, or None (typed Any:
    # that module builds on this one, so naming its class here would be an import cycle)
    multi_hot: Any = None

    @property
    def num_fields(self) -> int:
        return int(self.cards.shape[0])


def scaled_cardinalities(scale: float) -> np.ndarray:
    return np.maximum(2, np.round(np.array(CRITEO_CARDINALITIES) * scale)).astype(np.int64)


def _taper(pmf: np.ndarray, num_train: int) -> np.ndarray:
    count = pmf * num_train
    return (count / (count + LEARNABLE_COUNT)).astype(np.float32)


def build_model(cfg: CriteoLikeConfig, num_train: int) -> PlantedModel:
    """Draw the planted model for ``cfg`` (deterministic from ``cfg.seed``)."""
    cards = scaled_cardinalities(cfg.scale)
    nf = cards.size
    offsets = np.concatenate([[0], np.cumsum(cards)[:-1]]).astype(np.int64)
    ids = PowerLaw(cards, np.array(CRITEO_ZIPF_EXPONENTS, dtype=np.float64))
    num_users = max(1, int(round(cfg.num_samples / cfg.samples_per_user)))
    users = PowerLaw(np.array([num_users]), np.array([USER_ACTIVITY_EXPONENT]))

    def rng(*parts: int) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence([cfg.seed, *parts])))

    r0 = rng(1)
    mul = np.array([_coprime_multiplier(int(c), r0) for c in cards], dtype=np.int64)
    add = np.array([int(r0.integers(0, c)) for c in cards], dtype=np.int64)
    # Interactions between fields of at most INTERACTION_MAX_CARD values, so that the pairs'
    # values co-occur often enough to be learned (as the crosses that matter in real logs).
    medium = [f for f in range(nf) if 10 <= cards[f] <= INTERACTION_MAX_CARD] or list(range(nf))
    all_pairs = [(a, b) for i, a in enumerate(medium) for b in medium[i + 1 :]]
    pick = r0.choice(len(all_pairs), size=min(NUM_INTERACTION_PAIRS, len(all_pairs)), replace=False)
    pairs = [all_pairs[int(i)] for i in sorted(pick)]

    # Logit scale budget (std): ids ID_LOGIT_STD, interactions INTERACTION_LOGIT_STD, dense 0.5.
    sd_id = ID_LOGIT_STD / math.sqrt(nf)
    v = (INTERACTION_LOGIT_STD**2 / max(1, len(pairs)) / INTERACTION_RANK) ** 0.25
    weights = np.empty(int(cards.sum()), dtype=np.float32)
    factors: dict[int, np.ndarray] = {}
    inter_fields = sorted({f for p in pairs for f in p})
    for f in range(nf):
        taper = _taper(ids.pmf(f), num_train)  # by rank
        slot = (np.arange(cards[f], dtype=np.int64) * mul[f] + add[f]) % cards[f]
        w = rng(2, f).standard_normal(int(cards[f]), dtype=np.float32) * (sd_id * taper)
        weights[offsets[f] + slot] = w
        if f in inter_fields:
            vf = rng(3, f).standard_normal((int(cards[f]), INTERACTION_RANK), dtype=np.float32)
            vf *= (v * np.sqrt(taper))[:, None]
            out = np.empty_like(vf)
            out[slot] = vf
            factors[f] = out
    r4 = rng(4)
    dense_mu = np.exp(r4.uniform(0.0, 5.0, NUM_DENSE))  # count scales, as Criteo's integers
    dense_beta = r4.standard_normal(NUM_DENSE) * (0.5 / math.sqrt(NUM_DENSE)) / 1.2
    return PlantedModel(
        cards=cards, offsets=offsets, ids=ids, users=users, perm_mul=mul, perm_add=add,
        weights=weights, pairs=pairs, factors=factors, dense_mu=dense_mu,
        dense_beta=dense_beta, bias=0.0, locality=cfg.locality, num_users=num_users,
        seed=cfg.seed,
    )  # fmt: skip
