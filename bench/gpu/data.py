"""The benchmark's workload: Criteo-shaped ids with the u^4 law, optional user locality, a plan.

Ids. Field ``f`` (Criteo Kaggle cardinalities times ``card_scale``; 33.8M rows at scale 1) draws
local ids as ``floor(u^4 * card_f)`` with ``u`` uniform -- the law of issue 7 and of HET-GMP's own
scale run (``bench/bench_partition_scale.py``). With ``locality > 0`` every sample belongs to a
latent user (``samples_per_user`` samples per user on average, users drawn uniformly); for each
field, with probability ``locality`` the id is taken from the user's 4-slot profile (slots drawn
once per user from the same u^4 law, used with weights 8:4:2:1, as in :mod:`hetgmp.data.generate`),
otherwise it is a fresh u^4 draw. Both branches have the same marginal law, so locality changes
only co-occurrence (what partitioning exploits), not id frequencies. ``locality = 0`` is the
plain i.i.d. u^4 workload. Dense features (13, log-normal-ish) and labels (Bernoulli 0.25) are
random: the benchmark measures speed, not accuracy.

Everything is a pure function of ``seed`` and sample index chunk, numpy only, generated once per
run by :func:`prepare` (single process, before the ranks start) and shared by every contender as
memory-mapped ``.npy`` files, together with the plan (``hetgmp.partition.api.partition_ids``).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetgmp.data.generate import CRITEO_CARDINALITIES

NUM_DENSE = 13
PROFILE_SLOT_WEIGHTS = (8.0, 4.0, 2.0, 1.0)
CHUNK = 1 << 18
WORKLOAD_VERSION = 1


@dataclass(frozen=True)
class WorkloadSpec:
    """What :func:`prepare` generates (also the cache key of a prepared directory)."""

    num_samples: int = 2_000_000
    card_scale: float = 1.0
    locality: float = 0.8
    samples_per_user: float = 106.0
    seed: int = 0
    world_size: int = 2  # parts of the plan (1: no plan needed)
    method: str = "metis+refine"  # partition method (hetgmp.partition.api.METHODS)
    rounds: int = 2
    batch_size: int = 8192  # batch the partition cost model assumes
    max_mirror_rate: float = 0.01

    def check(self) -> None:
        if self.num_samples < 2:
            raise ValueError(f"--samples must be >= 2, got {self.num_samples}")
        if not 0 < self.card_scale <= 10:
            raise ValueError(f"--card-scale must be in (0, 10], got {self.card_scale}")
        if not 0 <= self.locality <= 1:
            raise ValueError(f"--locality must be in [0, 1], got {self.locality}")
        if self.samples_per_user < 1:
            raise ValueError(f"--samples-per-user must be >= 1, got {self.samples_per_user}")
        if self.world_size < 1:
            raise ValueError(f"world size must be >= 1, got {self.world_size}")


def cardinalities(card_scale: float) -> np.ndarray:
    """Criteo Kaggle field cardinalities times ``card_scale`` (at least 2 per field)."""
    return np.maximum(2, np.round(np.array(CRITEO_CARDINALITIES) * card_scale)).astype(np.int64)


def field_offsets(cards: np.ndarray) -> np.ndarray:
    """Global id of every field's local id 0."""
    return np.concatenate([[0], np.cumsum(cards)[:-1]]).astype(np.int64)


def _u4(u: np.ndarray, cards: np.ndarray) -> np.ndarray:
    """``floor(u^4 * card)`` clipped to ``card - 1`` (u in [0, 1), broadcast over fields)."""
    return np.minimum(np.floor(u**4 * cards), cards - 1).astype(np.int64)


def make_ids(
    num_samples: int,
    cards: np.ndarray,
    *,
    locality: float,
    samples_per_user: float,
    seed: int,
    threads: int = 0,
) -> np.ndarray:
    """Global ids ``[num_samples, F]`` int64 (see the module docstring); deterministic in seed."""
    cards = np.asarray(cards, dtype=np.int64)
    nf = cards.size
    offsets = field_offsets(cards)
    num_users = max(1, int(round(num_samples / samples_per_user)))
    prof_rng = np.random.default_rng([seed, 1])
    k = len(PROFILE_SLOT_WEIGHTS)
    profile = _u4(prof_rng.random((num_users, nf, k)), cards[None, :, None])
    cum = np.cumsum(PROFILE_SLOT_WEIGHTS) / sum(PROFILE_SLOT_WEIGHTS)
    out = np.empty((num_samples, nf), dtype=np.int64)

    def fill(c: int) -> None:
        lo, hi = c * CHUNK, min(num_samples, (c + 1) * CHUNK)
        rng = np.random.default_rng([seed, 2, c])  # per chunk: independent of thread count
        local = _u4(rng.random((hi - lo, nf)), cards)
        if locality > 0:
            user = rng.integers(0, num_users, hi - lo)
            use = rng.random((hi - lo, nf)) < locality
            slot = np.searchsorted(cum, rng.random((hi - lo, nf)), side="right")
            slot = np.minimum(slot, k - 1)
            prof = profile[user[:, None], np.arange(nf)[None, :], slot]
            local = np.where(use, prof, local)
        out[lo:hi] = local + offsets

    chunks = range((num_samples + CHUNK - 1) // CHUNK)
    with ThreadPoolExecutor(max_workers=threads or min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(fill, chunks))
    return out


def make_dense_labels(num_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random dense features ``[N, 13]`` float32 and labels ``[N, 1]`` float32."""
    rng = np.random.default_rng([seed, 3])
    dense = np.log1p(rng.exponential(5.0, (num_samples, NUM_DENSE))).astype(np.float32)
    labels = (rng.random((num_samples, 1)) < 0.25).astype(np.float32)
    return dense, labels


def rank_samples(
    data_partition: np.ndarray | None, num_samples: int, rank: int, world: int
) -> np.ndarray:
    """Sample indices of ``rank``: the plan's when given, else a contiguous shard."""
    if data_partition is not None:
        return np.flatnonzero(np.asarray(data_partition) == rank)
    lo, hi = rank * num_samples // world, (rank + 1) * num_samples // world
    return np.arange(lo, hi, dtype=np.int64)


@dataclass
class Workload:
    """A prepared directory: ids/dense/labels ``.npy`` (+ ``plan_{w}.npz``) and ``workload.json``."""

    root: Path
    spec: WorkloadSpec
    info: dict[str, Any]

    @property
    def num_rows(self) -> int:
        return int(self.info["num_rows"])

    @property
    def num_fields(self) -> int:
        return int(self.info["num_fields"])

    def ids(self) -> np.ndarray:
        return np.load(self.root / "ids.npy", mmap_mode="r")

    def dense(self) -> np.ndarray:
        return np.load(self.root / "dense.npy", mmap_mode="r")

    def labels(self) -> np.ndarray:
        return np.load(self.root / "labels.npy", mmap_mode="r")

    def plan_path(self) -> Path | None:
        p = self.root / f"plan_{self.spec.world_size}.npz"
        return p if p.exists() else None


def load_workload(root: str | os.PathLike[str]) -> Workload:
    """Open a directory written by :func:`prepare`."""
    root = Path(root)
    meta = root / "workload.json"
    if not meta.exists():
        raise FileNotFoundError(f"{root}: no workload.json; run bench/gpu/bench.py prepare first")
    info = json.loads(meta.read_text())
    return Workload(root, WorkloadSpec(**info["spec"]), info)


def prepare(root: str | os.PathLike[str], spec: WorkloadSpec, *, threads: int = 0) -> Workload:
    """Generate the data and (for ``world_size > 1``) the plan under ``root``; reuse a match."""
    spec.check()
    root = Path(root)
    meta = root / "workload.json"
    if meta.exists():
        old = json.loads(meta.read_text())
        if old.get("spec") == asdict(spec) and old.get("version") == WORKLOAD_VERSION:
            return Workload(root, spec, old)
    root.mkdir(parents=True, exist_ok=True)
    cards = cardinalities(spec.card_scale)
    num_rows = int(cards.sum())
    t = time.perf_counter()
    ids = make_ids(
        spec.num_samples,
        cards,
        locality=spec.locality,
        samples_per_user=spec.samples_per_user,
        seed=spec.seed,
        threads=threads,
    )
    dense, labels = make_dense_labels(spec.num_samples, spec.seed)
    gen_s = time.perf_counter() - t
    for name, arr in (("ids", ids), ("dense", dense), ("labels", labels)):
        np.save(root / f"{name}.npy", arr)
    info: dict[str, Any] = {
        "version": WORKLOAD_VERSION,
        "spec": asdict(spec),
        "num_rows": num_rows,
        "num_fields": int(cards.size),
        "cardinalities": cards.tolist(),
        "generate_s": gen_s,
        "id_law": "floor(u^4 * card) per field"
        + (f", user locality {spec.locality}" if spec.locality else ""),
    }
    if spec.world_size > 1:
        info["partition"] = _partition(root, spec, ids, num_rows, threads)
    tmp = meta.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=2, default=float))
    os.replace(tmp, meta)
    return Workload(root, spec, info)


def _partition(
    root: Path, spec: WorkloadSpec, ids: np.ndarray, num_rows: int, threads: int
) -> dict[str, Any]:
    """Partition ``ids`` into ``spec.world_size`` parts, save the plan under ``root``; return
    what ``workload.json`` records of it (method, wall time, expected fetches, balance)."""
    from hetgmp.partition.api import partition_ids
    from hetgmp.partition.plan import save_plan

    t = time.perf_counter()
    plan = partition_ids(
        ids.astype(np.int32) if num_rows < 2**31 else ids,
        num_rows,
        spec.world_size,
        method=spec.method,
        batch_size=spec.batch_size,
        seed=spec.seed,
        threads=threads or None,
        rounds=spec.rounds,
        max_mirror_rate=spec.max_mirror_rate,
        report_baselines=True,
        progress=False,
    )
    part_s = time.perf_counter() - t
    save_plan(plan, root / f"plan_{spec.world_size}.npz")
    q = plan.meta["quality"]
    return {
        "method": spec.method,
        "rounds": spec.rounds,
        "wall_s": part_s,
        "timing": plan.meta.get("timing"),
        "fetches_per_step": q.get("fetches_per_step"),
        "baselines": {k: v.get("fetches_per_step") for k, v in q.get("baselines", {}).items()},
        "samples_per_worker": np.bincount(plan.data_partition, minlength=spec.world_size)
        .astype(int)
        .tolist(),
    }
