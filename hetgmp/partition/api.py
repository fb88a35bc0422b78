"""Partition a data set: ``partition_dataset(ds, nparts, method=...) -> Plan``.

Methods:
  ``random``        samples and rows placed uniformly at random (balanced)
  ``hash``          row owner = id mod n, samples in contiguous shards (classic model parallel)
  ``refine``        HET-GMP's algorithm: random start, then alternating sample / row moves under
                    the batch-aware cost (:mod:`hetgmp.partition.cost`) with balance terms
  ``metis``         METIS on the bipartite graph (sampled above ``metis_max_edges``), the rest
                    placed greedily next to their neighbours
  ``metis+refine``  the METIS start, then the refinement rounds (the default)

Every plan carries, per worker, its non-owned rows by descending mirror priority, and a quality
report (with the same numbers for ``random`` and ``hash`` on the same data) in ``meta``.
"""

from __future__ import annotations

import dataclasses
import logging
import resource
import time
from typing import Any

import numpy as np

from hetgmp.data.format import Dataset
from hetgmp.fmt import key_values
from hetgmp.native import native
from hetgmp.partition import baselines, cost
from hetgmp.partition.metis_start import DEFAULT_METIS_MAX_EDGES, metis_start
from hetgmp.partition.plan import Plan, PlanError
from hetgmp.partition.quality import quality_report, rank_mirrors, summary_line
from hetgmp.partition.sample_rows import SampleRows, native_args

METHODS = ("random", "hash", "refine", "metis", "metis+refine")
DEFAULT_ROUNDS = 5
DEFAULT_THETA = 0.01  # weight of the owner-serving-load balance term (HET-GMP's value)

log = logging.getLogger("hetgmp.partition")


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    from hetgmp.progress import auto_unless_off, bar_wanted

    disable = not bar_wanted(auto_unless_off(enabled))
    return tqdm(total=total, desc=desc, disable=disable, leave=False)


@dataclasses.dataclass
class _Job:
    """What every stage of one partitioning run reads: the id matrix and the settings, plus
    the progress bar, per-stage timings and extra facts for the plan's ``meta``."""

    ids: np.ndarray | SampleRows
    num_rows: int
    nparts: int
    batch_size: int
    topo: np.ndarray
    threads: int
    bar: Any
    t0: float = dataclasses.field(default_factory=time.perf_counter)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.ids.shape[0])

    def stage(self, name: str) -> None:
        self.bar.set_postfix_str(name)


def partition_ids(
    sparse: np.ndarray | SampleRows,
    num_rows: int,
    nparts: int,
    *,
    method: str = "metis+refine",
    batch_size: int = 8192,
    seed: int = 0,
    threads: int | None = None,
    rounds: int = DEFAULT_ROUNDS,
    intra_cost: float = cost.DEFAULT_INTRA_COST,
    gpus_per_node: int | None = None,
    max_mirror_rate: float = baselines.DEFAULT_MAX_MIRROR_RATE,
    theta: float = DEFAULT_THETA,
    metis_max_edges: int = DEFAULT_METIS_MAX_EDGES,
    report_baselines: bool = True,
    progress: bool = True,
) -> Plan:
    """Partition the graph of an [N, F] id matrix, or of ragged lists with multi-hot fields
    (:class:`SampleRows`; ids in ``[0, num_rows)``) into ``nparts``:
    start (METIS or a baseline) -> graph -> greedy placement -> refinement rounds -> mirror
    ranking and quality report -> plan."""
    _check_args(method, sparse, num_rows, nparts, batch_size, rounds, max_mirror_rate)
    refining = method in ("refine", "metis+refine") and rounds > 0
    metis = method in ("metis", "metis+refine")
    # One bar over every stage: start, graph build, (greedy), each refinement round, report.
    bar = _progress(3 + metis + (rounds if refining else 0),
                    f"partition {method} into {nparts}", progress)  # fmt: skip
    job = _Job(
        _as_ids(sparse), num_rows, nparts, batch_size,
        cost.topology_matrix(nparts, gpus_per_node=gpus_per_node, intra_cost=intra_cost),
        int(threads or 0), bar,
    )  # fmt: skip
    dp, ep = _start(job, method, seed, metis_max_edges)
    refiner = _graph(job, dp, ep, theta)
    if metis:
        _greedy(job, refiner)
    history = _refine(job, refiner, rounds if refining else 0)
    data_part = np.array(refiner.data_partition(), dtype=np.int32)
    embed_part = np.array(refiner.embed_partition(), dtype=np.int32)
    counts = refiner.counts()  # (may view the refiner's memory: it lives until the report)
    t = time.perf_counter()
    mirrors, report = _mirrors_and_report(job, data_part, embed_part, counts, max_mirror_rate)
    del refiner, counts
    report["cost_history"] = history
    log.info("partition %s", summary_line(method, report))
    if report_baselines:
        report["baselines"] = _baseline_reports(job, method, seed)
    job.timings["report_s"] = time.perf_counter() - t
    bar.update(1)
    bar.close()
    job.timings["wall_s"] = time.perf_counter() - job.t0
    meta = {
        **_settings_meta(job, method, seed, rounds, theta, intra_cost, gpus_per_node),
        "max_mirror_rate": max_mirror_rate, "quality": report,
        "timing": {**job.timings, "peak_rss_mb": peak_rss_mb()}, **job.extra,
    }  # fmt: skip
    return Plan(data_part, embed_part, mirrors, meta).validate()


def _as_ids(sparse: np.ndarray | SampleRows) -> np.ndarray | SampleRows:
    """The ids as the native code takes them: ragged lists as they are, the matrix as a
    C-contiguous int32/int64 array."""
    if isinstance(sparse, SampleRows):
        return sparse
    ids = sparse if sparse.dtype in (np.int32, np.int64) else sparse.astype(np.int64)
    return np.ascontiguousarray(ids)


def _settings_meta(
    job: _Job, method: str, seed: int, rounds: int, theta: float, intra_cost: float,
    gpus_per_node: int | None,
) -> dict[str, Any]:  # fmt: skip
    """The run's settings, as the plan's ``meta`` records them."""
    return {
        "method": method, "seed": seed, "batch_size": job.batch_size,
        "rounds": rounds if method in ("refine", "metis+refine") else 0, "threads": job.threads,
        "theta": theta, "intra_cost": intra_cost, "gpus_per_node": gpus_per_node,
        "cost_matrix": job.topo, "num_samples": job.n, "num_rows": job.num_rows,
    }  # fmt: skip


def _check_args(
    method: str, sparse: np.ndarray | SampleRows, num_rows: int, nparts: int, batch_size: int, rounds: int,
    max_mirror_rate: float,
) -> None:  # fmt: skip
    if method not in METHODS:
        raise PlanError(f"--method {method!r} is not one of {list(METHODS)}")
    if sparse.ndim != 2:
        raise PlanError(
            f"sample ids must be a 2-D [samples, fields] array, got shape {sparse.shape}"
        )
    baselines._check_sizes(int(sparse.shape[0]), num_rows, nparts)
    if batch_size < 1:
        raise PlanError(f"--batch-size must be >= 1, got {batch_size}")
    if rounds < 0:
        raise PlanError(f"--rounds must be >= 0, got {rounds}")
    if not 0.0 <= max_mirror_rate <= 1.0:
        raise PlanError(f"--max-mirror-rate must lie in [0, 1], got {max_mirror_rate}")


def _start(job: _Job, method: str, seed: int, metis_max_edges: int) -> tuple[Any, Any]:
    """The starting owner of every sample and row: a baseline, or METIS on the graph."""
    job.stage("start")
    rng = np.random.default_rng([seed, 0x5EED])
    if method == "hash":
        start = baselines.hash_plan(job.n, job.num_rows, job.nparts)
        dp, ep = start.data_partition, start.embed_partition
    elif method in ("random", "refine"):
        dp = baselines.balanced_random(job.n, job.nparts, rng)
        ep = baselines.balanced_random(job.num_rows, job.nparts, rng)
    else:
        t = time.perf_counter()
        dp, ep, job.extra["metis"] = metis_start(
            job.ids, job.num_rows, job.nparts, seed=seed, max_edges=metis_max_edges,
            batch_size=job.batch_size, threads=job.threads,
        )  # fmt: skip
        job.timings["metis_s"] = time.perf_counter() - t
        log.info("partition metis %s", key_values(job.extra["metis"]))
    job.bar.update(1)
    return dp, ep


def _graph(job: _Job, dp: Any, ep: Any, theta: float) -> Any:
    """The native refiner over the sample <-> row graph (row -> sample CSR, use counts)."""
    job.stage("graph")
    t = time.perf_counter()
    values, offsets = native_args(job.ids)
    refiner = native().Refiner(
        values, dp, ep, job.nparts, job.num_rows, job.batch_size, job.topo, theta=theta,
        threads=job.threads, offsets=offsets,
    )  # fmt: skip
    job.timings["graph_s"] = time.perf_counter() - t
    job.bar.update(1)
    return refiner


def _greedy(job: _Job, refiner: Any) -> None:
    """Place what METIS left unplaced (samples, then rows) next to their neighbours."""
    job.stage("greedy placement")
    t = time.perf_counter()
    job.extra["greedy_placed"] = {
        "samples": int(refiner.assign_data()),
        "rows": int(refiner.assign_embed()),
    }
    job.timings["greedy_s"] = time.perf_counter() - t
    job.bar.update(1)


def _refine(job: _Job, refiner: Any, rounds: int) -> list[float]:
    """HET-GMP's alternating sample / row moves; the cost per step after each round."""
    m = refiner.samples_per_part
    history = [_cost(refiner, m, job.batch_size, job.topo, job.threads)]
    t = time.perf_counter()
    for r in range(rounds):
        moved_d = refiner.refine_data()
        moved_e = refiner.refine_embed()
        history.append(_cost(refiner, m, job.batch_size, job.topo, job.threads))
        log.info(
            "partition round=%d moved_samples=%d moved_rows=%d cost_per_step=%.1f "
            "elapsed_s=%.1f", r + 1, moved_d, moved_e, history[-1], time.perf_counter() - job.t0,
        )  # fmt: skip
        job.stage(f"round {r + 1}: cost {history[-1]:.0f}")
        job.bar.update(1)
    if rounds:
        job.timings["refine_s"] = time.perf_counter() - t
    return history


def _mirrors_and_report(
    job: _Job, data_part: np.ndarray, embed_part: np.ndarray, counts: Any, max_mirror_rate: float
) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Every worker's non-owned rows by mirror priority (cut to ``max_mirror_rate``) and the
    plan's quality report."""
    job.stage("mirrors and report")
    limit_rate = max(max_mirror_rate, 0.1)  # the report needs store rates up to 0.1
    mirrors, gains = rank_mirrors(
        job.ids, data_part, embed_part, job.nparts, batch_size=job.batch_size, topo=job.topo,
        max_mirror_rate=limit_rate, num_rows=job.num_rows, counts=counts, threads=job.threads,
    )  # fmt: skip
    keep = int(round(max_mirror_rate * job.num_rows))
    report = quality_report(
        job.ids, data_part, embed_part, job.nparts, batch_size=job.batch_size, topo=job.topo,
        num_rows=job.num_rows, counts=counts, mirror_gains=gains, threads=job.threads,
    )  # fmt: skip
    return [mir[:keep] for mir in mirrors], report


def _baseline_reports(job: _Job, method: str, seed: int) -> dict[str, Any]:
    """The same quality report for the random and hash plans of the same data."""
    out: dict[str, Any] = {}
    for name in ("random", "hash"):
        if name == method:
            continue
        base = (baselines.hash_plan(job.n, job.num_rows, job.nparts) if name == "hash"
                else baselines.random_plan(job.n, job.num_rows, job.nparts, seed))  # fmt: skip
        rep = quality_report(
            job.ids, base.data_partition, base.embed_partition, job.nparts,
            batch_size=job.batch_size, topo=job.topo, num_rows=job.num_rows, threads=job.threads,
        )  # fmt: skip
        rep.pop("workers")
        out[name] = rep
        log.info("partition %s", summary_line(name, rep))
    return out


def _cost(refiner: Any, m: int, batch_size: int, topo: np.ndarray, threads: int) -> float:
    f = native().fetch_matrix(refiner.counts(), refiner.embed_partition(), m, batch_size, threads)
    return cost.total_cost(f, topo)


def partition_dataset(
    ds: Dataset,
    nparts: int,
    *,
    method: str = "metis+refine",
    batch_size: int = 8192,
    seed: int = 0,
    threads: int | None = None,
    rounds: int = DEFAULT_ROUNDS,
    intra_cost: float = cost.DEFAULT_INTRA_COST,
    gpus_per_node: int | None = None,
    max_mirror_rate: float = baselines.DEFAULT_MAX_MIRROR_RATE,
    theta: float = DEFAULT_THETA,
    metis_max_edges: int = DEFAULT_METIS_MAX_EDGES,
    report_baselines: bool = True,
    progress: bool = True,
) -> Plan:
    """Partition the training split of ``ds`` into ``nparts`` workers (see module docstring);
    multi-hot fields add one edge per id of every list (:mod:`hetgmp.partition.sample_rows`)."""
    plan = partition_ids(
        train_rows(ds),
        ds.meta.num_embeddings,
        nparts,
        method=method,
        batch_size=batch_size,
        seed=seed,
        threads=threads,
        rounds=rounds,
        intra_cost=intra_cost,
        gpus_per_node=gpus_per_node,
        max_mirror_rate=max_mirror_rate,
        theta=theta,
        metis_max_edges=metis_max_edges,
        report_baselines=report_baselines,
        progress=progress,
    )
    plan.meta["dataset_fingerprint"] = ds.fingerprint
    plan.meta["dataset"] = str(ds.root)
    return plan


def train_rows(ds: Dataset) -> np.ndarray | SampleRows:
    """The training split's sample -> row ids: the id matrix, or with multi-hot fields every
    sample's single-hot ids and lists as one ragged list."""
    if not ds.meta.multi_hot:
        return ds.train.sparse
    from hetgmp.partition.sample_rows import combine

    return combine(np.asarray(ds.train.sparse), ds.train.multi_hot)
