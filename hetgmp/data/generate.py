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

Layout: the options are in :mod:`hetgmp.data.generate_config`, the planted model in
:mod:`hetgmp.data.planted_model`, its samples in :mod:`hetgmp.data.planted_samples`, the
multi-hot lists in :mod:`hetgmp.data.planted_multi_hot` (their ``--communities`` in
:mod:`hetgmp.data.planted_communities`), the
hashing in :mod:`hetgmp.data.counter_hash` and the statistics in
:mod:`hetgmp.data.generate_stats`; this module holds the driver, and re-exports the others'
public names (their old import path).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from hetgmp.config import validate
from hetgmp.data.format import Dataset, DatasetWriter, FieldInfo, make_fields
from hetgmp.data.generate_config import CriteoLikeConfig, GenerateError
from hetgmp.data.generate_stats import FieldCounts, excess_repeat_rate, repeat_rate
from hetgmp.data.planted_model import (
    CRITEO_CARDINALITIES,
    CRITEO_ZIPF_EXPONENTS,
    ID_LOGIT_STD,
    INTERACTION_LOGIT_STD,
    INTERACTION_MAX_CARD,
    INTERACTION_RANK,
    LEARNABLE_COUNT,
    NUM_DENSE,
    NUM_INTERACTION_PAIRS,
    PROFILE_SLOT_WEIGHTS,
    USER_ACTIVITY_EXPONENT,
    PlantedModel,
    PowerLaw,
    build_model,
    expected_distinct,
    scaled_cardinalities,
)
from hetgmp.data.planted_multi_hot import build_multi_hot
from hetgmp.data.planted_samples import (
    Chunk,
    generate_chunk,
    labels_and_probs,
    sample_users,
    solve_bias,
)
from hetgmp.metrics import roc_auc

# The names that lived here before the split stay importable from here.
__all__ = [
    "CRITEO_CARDINALITIES", "CRITEO_ZIPF_EXPONENTS", "GENERATOR_VERSION", "ID_LOGIT_STD",
    "INTERACTION_LOGIT_STD", "INTERACTION_MAX_CARD", "INTERACTION_RANK", "KAGGLE_NUM_SAMPLES",
    "LEARNABLE_COUNT", "NUM_DENSE", "NUM_INTERACTION_PAIRS", "PILOT_SAMPLES",
    "PROFILE_SLOT_WEIGHTS", "USER_ACTIVITY_EXPONENT", "Chunk", "CriteoLikeConfig", "FieldCounts",
    "GenerateError", "PlantedModel", "PowerLaw", "build_model", "excess_repeat_rate",
    "expected_distinct", "generate_chunk", "generate_criteo_like", "generate_from_config",
    "labels_and_probs", "repeat_rate", "sample_users", "scaled_cardinalities", "solve_bias",
]  # fmt: skip

# Bump when the same seed and options would give different data (cached default sets regenerate).
GENERATOR_VERSION = 2
KAGGLE_NUM_SAMPLES = 45_840_617
PILOT_SAMPLES = 200_000


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

    from hetgmp.progress import auto_unless_off, bar_wanted

    return tqdm(
        total=total, unit="rows", unit_scale=True, desc="generate",
        disable=not bar_wanted(auto_unless_off(enabled)),
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
    multi_hot: str = "",
    communities: int = 0,
    community_global: float = 0.1,
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
        samples_per_user=samples_per_user, multi_hot=multi_hot, communities=communities,
        community_global=community_global, chunk_size=chunk_size,
        workers=workers,
        progress=progress, overwrite=overwrite,
    ))  # fmt: skip
    return generate_from_config(out, cfg, log=log)


@dataclasses.dataclass
class _Tally:
    """What the driver gathers while writing: id counts, positives, test labels and probs."""

    counts: FieldCounts
    positives: dict[str, int] = dataclasses.field(default_factory=lambda: {"train": 0, "test": 0})
    test_probs: list[np.ndarray] = dataclasses.field(default_factory=list)
    test_labels: list[np.ndarray] = dataclasses.field(default_factory=list)


def planted_model(cfg: CriteoLikeConfig, n_train: int) -> Any:
    """The generator's planted model of ``cfg`` (fields, users, pairs and, with ``--multi-hot``,
    the lists), as :func:`generate_from_config` draws from it (``n_train``: training samples)."""
    m = build_model(cfg, n_train)
    m.multi_hot = build_multi_hot(
        cfg.multi_hot, cfg.scale, cfg.locality, cfg.seed, n_train, int(m.cards.sum()),
        communities=cfg.communities, global_share=cfg.community_global,
        user_pmf=m.users.pmf(0),
    )  # fmt: skip
    return m


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
    m = planted_model(cfg, n_train)
    pilot = generate_chunk(m, 0, min(PILOT_SAMPLES, cfg.num_samples))
    m.bias = solve_bias(pilot.logit, cfg.positive_rate)
    fields = make_fields([f"C{i + 1}" for i in range(m.num_fields)], m.cards.tolist())
    writer = DatasetWriter(
        out, fields, NUM_DENSE, name=Path(out).name, overwrite=cfg.overwrite,
        multi_hot=_multi_hot_fields(m),
    )  # fmt: skip
    tally = _Tally(FieldCounts(m.cards))
    try:
        _write_samples(writer, m, cfg, n_train, tally, say, t0)
        _finish_meta(writer, m, cfg, (n_train, n_test), tally)
        ds = writer.close()
    except BaseException:
        writer.abort()
        raise
    say(f"generate done rows={cfg.num_samples} rows_table={int(m.cards.sum())} "
        f"best_auc={ds.meta.best_auc:.4f} elapsed_s={time.perf_counter() - t0:.1f} out={out}")  # fmt: skip
    return ds


def _write_samples(
    writer: DatasetWriter,
    m: PlantedModel,
    cfg: CriteoLikeConfig,
    n_train: int,
    tally: _Tally,
    say: Callable[[str], Any],
    t0: float,
) -> None:
    """Generate all samples in chunks and append them to ``writer``; one log line per 10 %."""
    workers = cfg.workers or min(4, os.cpu_count() or 1)
    bar = _progress(cfg.num_samples, cfg.progress)
    done, next_log = 0, cfg.num_samples / 10
    ranges = list(_chunks(0, cfg.num_samples, cfg.chunk_size))
    # Chunks must not straddle the train/test boundary.
    ranges = [r for s, n in ranges for r in _split_range(s, n, n_train)]
    for c in _ordered_map(m, ranges, workers):
        labels, probs = labels_and_probs(m, c)
        split = "train" if c.start < n_train else "test"
        writer.append(
            split, c.local + m.offsets, c.dense, labels, check_ids=False, multi_hot=c.bags
        )
        tally.positives[split] += int(labels.sum())
        if split == "test":
            tally.test_probs.append(probs)
            tally.test_labels.append(labels)
        tally.counts.add(c.local)
        done += c.local.shape[0]
        bar.update(c.local.shape[0])
        if done >= next_log or done == cfg.num_samples:
            el = time.perf_counter() - t0
            say(f"generate rows={done} total={cfg.num_samples} elapsed_s={el:.1f} "
                f"rows_per_s={done / max(el, 1e-9):.0f}")  # fmt: skip
            while next_log <= done:
                next_log += cfg.num_samples / 10
    bar.close()


def _finish_meta(
    writer: DatasetWriter,
    m: PlantedModel,
    cfg: CriteoLikeConfig,
    sizes: tuple[int, int],
    tally: _Tally,
) -> None:
    """Save the test split's true probabilities and fill in stats, source and best AUC."""
    n_train, n_test = sizes
    probs_all = np.concatenate(tally.test_probs)
    np.save(writer.tmp / "test_true_probs.npy", probs_all)
    writer.meta.stats = {
        "positive_rate_train": round(tally.positives["train"] / n_train, 6),
        "positive_rate_test": round(tally.positives["test"] / n_test, 6),
        "num_users": m.num_users,
        **tally.counts.summary(),
    }
    writer.meta.source = {
        "kind": "generated",
        "generator": "criteo-like",
        "generator_version": GENERATOR_VERSION,
        "config": _source_config(cfg),
        "zipf_exponents": list(CRITEO_ZIPF_EXPONENTS),
        "interaction_pairs": [list(p) for p in m.pairs],
        "bias": m.bias,
        "calibration": "see hetgmp.data.generate docstring; bench/bench_generate_calibrate.py",
    }  # fmt: skip
    writer.meta.best_auc = roc_auc(np.concatenate(tally.test_labels), probs_all)


def _source_config(cfg: CriteoLikeConfig) -> dict[str, Any]:
    """The options that shape the data; ``--communities``' two only where used, so a set made
    without them records what it always did."""
    skip = {"progress", "overwrite", "workers", "chunk_size"}
    if not cfg.communities:
        skip |= {"communities", "community_global"}
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in skip}


def _multi_hot_fields(m: PlantedModel) -> list[FieldInfo]:
    """The multi-hot fields ``M1, M2, ...`` after the single-hot ones (none by default)."""
    mm = m.multi_hot
    if mm is None:
        return []
    pairs = enumerate(zip(mm.cards, mm.offsets, strict=True))
    return [FieldInfo(f"M{k + 1}", int(c), int(o)) for k, (c, o) in pairs]


def _split_range(s: int, n: int, boundary: int) -> list[tuple[int, int]]:
    if s < boundary < s + n:
        return [(s, boundary - s), (boundary, s + n - boundary)]
    return [(s, n)]
