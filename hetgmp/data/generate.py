"""Synthetic Criteo-like click data with planted labels and tunable locality.

The embedded default data set for the demo, the tests and the benchmarks. It has the shape of the
Criteo Kaggle data (26 categorical fields with the Kaggle cardinalities times ``scale``, 13 dense
features) and the properties the HET-GMP approach depends on:

* **Power-law id frequencies.** Field ``f`` draws id *ranks* from a bounded continuous power law
  with exponent ``a_f`` (binned), then maps ranks to ids with a per-field affine permutation, so
  hot ids are not simply the small ids. The exponents were fitted so that the expected number of
  distinct values in 8,000 draws equals the count measured on ``criteo-sample`` (8,000 real Kaggle
  rows; fields whose sample nearly exhausts the cardinality are not identifiable and use 1.0). The
  fit is reproduced by ``bench/bench_generate_calibrate.py``, which reads the real sample in place.
* **Locality.** Every sample belongs to a latent user (user activity is itself a power law with
  exponent 0.7, which reproduces the Gini coefficient 0.47 of ratings per user in
  ``movielens-100k``; on average ``samples_per_user`` = 106 samples per user, MovieLens' mean). For
  each field, with probability ``locality`` the id comes from the user's own small profile (4 slots
  drawn once per user from the field's power law, used with weights 8:4:2:1), otherwise from the
  global power law. Both branches have the same marginal id distribution, so the knob changes only
  co-occurrence structure (what partitioning exploits), not frequencies. The default 0.8 makes the
  mean *excess within-user repeat rate* over fields (:func:`excess_repeat_rate`: share of samples
  whose field value the same user already used, beyond the rate with users randomly re-assigned,
  normalised) 0.53, as measured on MovieLens' non-user fields (item, genre, age, gender,
  occupation, zip prefix) with the same number of samples and users; ``bench/bench_generate_calibrate.py`` measures both.
* **Planted, learnable labels.** ``logit = b + sum_f w[id_f] + sum_pairs <V_a[id_a], V_b[id_b]> +
  beta . dense``: per-id weights (logit std 1.3), rank-4 interactions between 8 pairs of fields of
  at most 20,000 values (std 0.4), and a linear dense term (std 0.5). As in real CTR logs, most of
  the signal is first-order: at 4M samples, scale 1, the true first-order + dense logit alone has
  AUC 0.777 of best_auc 0.788 (before: interactions of std 0.7 also over fields of up to 300k
  values took 0.041 of best_auc 0.776, three times the LR-to-deep gap on Criteo, and WDL learned
  none of it in one epoch). A weight's scale shrinks with the id's expected count in the data set
  (``count / (count + 100)``), so the signal sits in ids seen often enough to learn, as in real
  logs, and an embedding + MLP model can approach the best AUC. ``b`` is solved on a pilot of the
  first samples to hit ``positive_rate``. ``meta.best_auc`` is the exact AUC of the true
  probabilities on the test split (stored in ``test_true_probs.npy``).

Determinism: every random number is a counter-based hash (splitmix64) of ``(seed, purpose, field,
sample index or user/slot)``, and the weight tables come from seeded per-field generators, so the
same seed gives byte-identical arrays for any chunk size and worker count.

Memory is O(rows of the table) (float32 weights, uint32 counts for statistics) plus O(chunk);
samples are streamed through :class:`~hetgmp.data.format.DatasetWriter`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from hetgmp.config import option, validate
from hetgmp.data.format import Dataset, DatasetWriter, make_fields
from hetgmp.metrics import roc_auc

CRITEO_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
# Power-law exponent per field, fitted to distinct-value counts of criteo-sample (see module doc).
CRITEO_ZIPF_EXPONENTS: tuple[float, ...] = (
    1.98, 1.48, 1.04, 1.10, 2.61, 3.00, 0.98, 2.32, 1.00, 1.12, 1.06, 1.05, 1.05,
    3.00, 1.16, 1.07, 1.00, 1.29, 1.52, 1.00, 1.06, 3.00, 3.00, 1.19, 2.85, 1.25,
)  # fmt: skip
NUM_DENSE = 13
# Bump when the same seed and options would give different data (cached default sets regenerate).
GENERATOR_VERSION = 2
KAGGLE_NUM_SAMPLES = 45_840_617
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
PILOT_SAMPLES = 200_000

_G = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))


class GenerateError(ValueError):
    """Invalid generator options."""


@dataclasses.dataclass
class CriteoLikeConfig:
    """Options of ``hetgmp generate criteo-like`` (defaults: a demo set made in seconds)."""

    num_samples: int = option(
        300_000, help="total samples (train + test)", check=lambda v: v >= 2, check_msg=">= 2"
    )
    scale: float = option(
        0.01,
        help="factor on the Criteo Kaggle field cardinalities (1.0 = 33.8M rows; min 2 per field)",
        check=lambda v: 0 < v <= 100,
        check_msg="in (0, 100]",
    )
    locality: float = option(
        0.8,
        help="probability that a field's id comes from the sample's user profile (0 none, 1 strong)",
        check=lambda v: 0 <= v <= 1,
        check_msg="in [0, 1]",
    )
    seed: int = option(0, help="random seed", check=lambda v: 0 <= v < 2**63, check_msg=">= 0")
    test_fraction: float = option(
        0.1, help="share of samples in the test split (the last ones)",
        check=lambda v: 0 < v < 1, check_msg="in (0, 1)",
    )  # fmt: skip
    positive_rate: float = option(
        0.25, help="target share of positive labels",
        check=lambda v: 0.001 <= v <= 0.999, check_msg="in [0.001, 0.999]",
    )  # fmt: skip
    samples_per_user: float = option(
        106.0, help="mean samples per latent user (movielens-100k: 106)",
        check=lambda v: v >= 1, check_msg=">= 1",
    )  # fmt: skip
    chunk_size: int = option(
        32768, help="rows per generated chunk (does not change the output)",
        check=lambda v: v >= 1, check_msg=">= 1",
    )  # fmt: skip
    workers: int = option(
        0, help="generator threads (0 = number of CPUs, at most 4; does not change the output)",
        check=lambda v: v >= 0, check_msg=">= 0",
    )  # fmt: skip
    progress: bool = option(True, help="show a progress bar when stderr is a terminal")
    overwrite: bool = option(False, help="replace an existing output directory")


# ----------------------------------------------------------------------------- hashing


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, in place on a uint64 array (wrapping arithmetic)."""
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


def _salt(*parts: int) -> np.uint64:
    """A 64-bit stream key from small integers (seed, purpose, field, ...)."""
    x = np.array([0x2545F4914F6CDD1D], dtype=np.uint64)
    for p in parts:
        x ^= np.uint64(p & 0xFFFFFFFFFFFFFFFF)
        x = _mix(x * _G)
    return np.uint64(x[0])


def _uniform(h: np.ndarray) -> np.ndarray:
    """Uniform float64 in [0, 1) from the top 53 bits of a hash."""
    return (h >> _S11).astype(np.float64) * (1.0 / 9007199254740992.0)


def _hash_uniform(keys: np.ndarray) -> np.ndarray:
    return _uniform(_mix(keys * _G))


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


@dataclasses.dataclass
class Chunk:
    """Generated samples ``[start, start + n)``: local ids, dense, logits (without bias)."""

    start: int
    local: np.ndarray  # int64 [n, F], id within the field
    dense: np.ndarray  # float32 [n, NUM_DENSE]
    logit: np.ndarray  # float64 [n], without the bias


def sample_users(m: PlantedModel, start: int, n: int) -> np.ndarray:
    """Latent user (int64) of samples ``start .. start+n-1`` (not stored in the data set)."""
    idx = np.arange(start, start + n, dtype=np.uint64)
    return m.users.ranks(_hash_uniform(idx + _salt(m.seed, 10))[:, None])[:, 0]


def repeat_rate(users: np.ndarray, values: np.ndarray) -> float:
    """Share of samples whose value the same user already had in an earlier sample."""
    key = np.stack([users.astype(np.int64), values.astype(np.int64)], axis=1)
    return 1.0 - np.unique(key, axis=0).shape[0] / max(1, key.shape[0])


def excess_repeat_rate(users: np.ndarray, values: np.ndarray, seed: int = 0) -> float:
    """Within-user repeat rate beyond chance, normalised: ``(r - r0) / (1 - r0)``.

    ``r0`` is the rate with users randomly re-assigned to samples (same user sizes), so a field
    that repeats only because it has few values scores 0 and one fixed per user scores ~1. This is
    the locality statistic the default ``locality`` is calibrated with.
    """
    r = repeat_rate(users, values)
    r0 = repeat_rate(np.random.default_rng(seed).permutation(users), values)
    return (r - r0) / (1.0 - r0) if r0 < 1.0 else 0.0


def generate_chunk(m: PlantedModel, start: int, n: int) -> Chunk:
    """Samples ``start .. start+n-1``; a pure function of (model, sample index)."""
    s = m.seed
    idx = np.arange(start, start + n, dtype=np.uint64)
    user = sample_users(m, start, n).astype(np.uint64)
    nf = m.num_fields
    fields = np.arange(nf, dtype=np.uint64)
    # One hash per (sample, field) decides profile-vs-global and the profile slot.
    h = _mix((idx[:, None] * np.uint64(nf) + fields) * _G + _salt(s, 11))
    coin = (h >> np.uint64(32)).astype(np.float64) * (1.0 / 4294967296.0)
    slot_u = (h & np.uint64(0xFFFFFFFF)).astype(np.float64) * (1.0 / 4294967296.0)
    cum = np.cumsum(PROFILE_SLOT_WEIGHTS) / sum(PROFILE_SLOT_WEIGHTS)
    slot = np.searchsorted(cum, slot_u, side="right").astype(np.uint64)
    k = np.uint64(len(PROFILE_SLOT_WEIGHTS))
    profile_key = ((user[:, None] * k + slot) * np.uint64(nf) + fields) ^ _salt(s, 12)
    global_key = (idx[:, None] * np.uint64(nf) + fields) ^ _salt(s, 13)
    key = np.where(coin < m.locality, profile_key, global_key)
    rank = m.ids.ranks(_hash_uniform(key))
    local = (rank * m.perm_mul + m.perm_add) % m.cards

    # Dense: skewed count-like values, log-transformed like Criteo's integers; the user scales them.
    activity = 0.5 + _hash_uniform(user + _salt(s, 14))
    du = _hash_uniform(
        (idx[:, None] * np.uint64(NUM_DENSE) + np.arange(NUM_DENSE, dtype=np.uint64)) ^ _salt(s, 15)
    )
    dense = np.log1p(-np.log1p(-du) * m.dense_mu * activity[:, None])

    logit = m.weights[local + m.offsets].astype(np.float64).sum(axis=1)
    for a, b in m.pairs:
        logit += np.einsum("ij,ij->i", m.factors[a][local[:, a]], m.factors[b][local[:, b]])
    logit += dense @ m.dense_beta
    return Chunk(start=start, local=local, dense=dense.astype(np.float32), logit=logit)


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
    u = _hash_uniform(idx ^ _salt(m.seed, 16))
    return (u < p).astype(np.float32), p


# ----------------------------------------------------------------------------- statistics


class FieldCounts:
    """Exact per-id occurrence counts (uint32), accumulated with per-field bincounts in groups."""

    def __init__(self, cards: np.ndarray, group_rows: int = 1 << 20) -> None:
        self.cards = cards
        self.counts = [np.zeros(int(c), dtype=np.uint32) for c in cards]
        self._buf: list[np.ndarray] = []
        self._rows = 0
        self.group_rows = group_rows

    def add(self, local: np.ndarray) -> None:
        self._buf.append(local)
        self._rows += local.shape[0]
        if self._rows >= self.group_rows:
            self.flush()

    def flush(self) -> None:
        if not self._buf:
            return
        block = np.concatenate(self._buf)
        for f, c in enumerate(self.counts):
            c += np.bincount(block[:, f], minlength=c.size).astype(np.uint32)
        self._buf, self._rows = [], 0

    def summary(self) -> dict[str, Any]:
        self.flush()
        distinct, top1, top_share = [], [], []
        for c in self.counts:
            total = int(c.sum(dtype=np.int64))
            k = max(1, c.size // 100)
            top = np.partition(c, c.size - k)[c.size - k :].sum(dtype=np.int64)
            distinct.append(int(np.count_nonzero(c)))
            top1.append(round(float(top) / max(1, total), 4))
            top_share.append(round(float(c.max()) / max(1, total), 4))
        return {
            "distinct_ids_per_field": distinct,
            "top1pct_id_share_per_field": top1,
            "top_id_share_per_field": top_share,
        }


# ----------------------------------------------------------------------------- driver


def _chunks(start: int, end: int, size: int) -> Iterator[tuple[int, int]]:
    for s in range(start, end, size):
        yield s, min(size, end - s)


def _ordered_map(m: PlantedModel, ranges: list[tuple[int, int]], workers: int) -> Iterator[Chunk]:
    """generate_chunk over ``ranges`` with ``workers`` threads, in order, a bounded window ahead."""
    if workers <= 1:
        for s, n in ranges:
            yield generate_chunk(m, s, n)
        return
    with ThreadPoolExecutor(workers) as ex:
        window: list[Future[Chunk]] = []
        it = iter(ranges)
        for s, n in it:
            window.append(ex.submit(generate_chunk, m, s, n))
            if len(window) >= 2 * workers:
                break
        while window:
            yield window.pop(0).result()
            nxt = next(it, None)
            if nxt is not None:
                window.append(ex.submit(generate_chunk, m, *nxt))


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total, unit="rows", unit_scale=True, desc="generate",
        disable=not (enabled and sys.stderr.isatty()),
    )  # fmt: skip


def generate_criteo_like(
    out: str | os.PathLike[str],
    *,
    num_samples: int = 300_000,
    scale: float = 0.01,
    locality: float = 0.8,
    seed: int = 0,
    test_fraction: float = 0.1,
    positive_rate: float = 0.25,
    samples_per_user: float = 106.0,
    chunk_size: int = 32768,
    workers: int = 0,
    progress: bool = True,
    overwrite: bool = False,
    log: Any = None,
) -> Dataset:
    """Generate a Criteo-like data set at ``out``; see the module docstring for the model.

    ``log`` is a callable taking one line (default: print to stderr); one line per 10 % of rows.
    """
    cfg = validate(CriteoLikeConfig(
        num_samples=num_samples, scale=scale, locality=locality, seed=seed,
        test_fraction=test_fraction, positive_rate=positive_rate,
        samples_per_user=samples_per_user, chunk_size=chunk_size, workers=workers,
        progress=progress, overwrite=overwrite,
    ))  # fmt: skip
    return generate_from_config(out, cfg, log=log)


def generate_from_config(
    out: str | os.PathLike[str], cfg: CriteoLikeConfig, log: Any = None
) -> Dataset:
    """:func:`generate_criteo_like` with a validated :class:`CriteoLikeConfig`."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    n_test = max(1, int(round(cfg.num_samples * cfg.test_fraction)))
    n_train = cfg.num_samples - n_test
    if n_train < 1:
        raise GenerateError(f"--num-samples {cfg.num_samples} leaves no training samples")
    m = build_model(cfg, n_train)
    pilot = generate_chunk(m, 0, min(PILOT_SAMPLES, cfg.num_samples))
    m.bias = solve_bias(pilot.logit, cfg.positive_rate)
    workers = cfg.workers or min(4, os.cpu_count() or 1)
    fields = make_fields([f"C{i + 1}" for i in range(m.num_fields)], m.cards.tolist())
    writer = DatasetWriter(out, fields, NUM_DENSE, name=Path(out).name, overwrite=cfg.overwrite)
    counts = FieldCounts(m.cards)
    test_probs: list[np.ndarray] = []
    test_labels: list[np.ndarray] = []
    positives = {"train": 0, "test": 0}
    try:
        bar = _progress(cfg.num_samples, cfg.progress)
        done, next_log = 0, cfg.num_samples / 10
        ranges = list(_chunks(0, cfg.num_samples, cfg.chunk_size))
        # Chunks must not straddle the train/test boundary.
        ranges = [r for s, n in ranges for r in _split_range(s, n, n_train)]
        for c in _ordered_map(m, ranges, workers):
            labels, probs = labels_and_probs(m, c)
            split = "train" if c.start < n_train else "test"
            writer.append(split, c.local + m.offsets, c.dense, labels, check_ids=False)
            positives[split] += int(labels.sum())
            if split == "test":
                test_probs.append(probs)
                test_labels.append(labels)
            counts.add(c.local)
            done += c.local.shape[0]
            bar.update(c.local.shape[0])
            if done >= next_log or done == cfg.num_samples:
                el = time.perf_counter() - t0
                say(f"generate rows={done} total={cfg.num_samples} elapsed_s={el:.1f} "
                    f"rows_per_s={done / max(el, 1e-9):.0f}")  # fmt: skip
                while next_log <= done:
                    next_log += cfg.num_samples / 10
        bar.close()
        probs_all = np.concatenate(test_probs)
        np.save(writer.tmp / "test_true_probs.npy", probs_all)
        writer.meta.stats = {
            "positive_rate_train": round(positives["train"] / n_train, 6),
            "positive_rate_test": round(positives["test"] / n_test, 6),
            "num_users": m.num_users,
            **counts.summary(),
        }
        writer.meta.source = {
            "kind": "generated",
            "generator": "criteo-like",
            "generator_version": GENERATOR_VERSION,
            "config": {k: v for k, v in dataclasses.asdict(cfg).items()
                       if k not in ("progress", "overwrite", "workers", "chunk_size")},
            "zipf_exponents": list(CRITEO_ZIPF_EXPONENTS),
            "interaction_pairs": [list(p) for p in m.pairs],
            "bias": m.bias,
            "calibration": "see hetgmp.data.generate docstring; bench/bench_generate_calibrate.py",
        }  # fmt: skip
        writer.meta.best_auc = roc_auc(np.concatenate(test_labels), probs_all)
        ds = writer.close()
    except BaseException:
        writer.abort()
        raise
    say(f"generate done rows={cfg.num_samples} rows_table={int(m.cards.sum())} "
        f"best_auc={ds.meta.best_auc:.4f} elapsed_s={time.perf_counter() - t0:.1f} out={out}")  # fmt: skip
    return ds


def _split_range(s: int, n: int, boundary: int) -> list[tuple[int, int]]:
    if s < boundary < s + n:
        return [(s, boundary - s), (boundary, s + n - boundary)]
    return [(s, n)]
