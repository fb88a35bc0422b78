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

import logging
import resource
import sys
import time
from typing import Any

import numpy as np

from hetgmp.data.format import Dataset
from hetgmp.native import native
from hetgmp.partition import baselines, cost
from hetgmp.partition.metis_start import DEFAULT_METIS_MAX_EDGES, metis_start
from hetgmp.partition.plan import Plan, PlanError
from hetgmp.partition.quality import quality_report, rank_mirrors, summary_line

METHODS = ("random", "hash", "refine", "metis", "metis+refine")
DEFAULT_ROUNDS = 5
DEFAULT_THETA = 0.01  # weight of the owner-serving-load balance term (HET-GMP's value)

log = logging.getLogger("hetgmp.partition")


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not (enabled and sys.stderr.isatty()), leave=False)


def partition_ids(
    sparse: np.ndarray,
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
    """Partition the graph of an [N, F] id matrix (ids in ``[0, num_rows)``) into ``nparts``."""
    t0 = time.perf_counter()
    if method not in METHODS:
        raise PlanError(f"--method {method!r} is not one of {list(METHODS)}")
    if sparse.ndim != 2:
        raise PlanError(f"sample ids must be a 2-D [samples, fields] array, got shape {sparse.shape}")
    n = int(sparse.shape[0])
    baselines._check_sizes(n, num_rows, nparts)
    if batch_size < 1:
        raise PlanError(f"--batch-size must be >= 1, got {batch_size}")
    if rounds < 0:
        raise PlanError(f"--rounds must be >= 0, got {rounds}")
    if not 0.0 <= max_mirror_rate <= 1.0:
        raise PlanError(f"--max-mirror-rate must lie in [0, 1], got {max_mirror_rate}")
    nthreads = int(threads or 0)
    topo = cost.topology_matrix(nparts, gpus_per_node=gpus_per_node, intra_cost=intra_cost)
    ids = sparse if sparse.dtype in (np.int32, np.int64) else np.asarray(sparse, dtype=np.int64)
    ids = np.ascontiguousarray(ids)
    timings: dict[str, float] = {}
    extra: dict[str, Any] = {}
    rng = np.random.default_rng([seed, 0x5EED])
    refining = method in ("refine", "metis+refine") and rounds > 0
    # One bar over every stage: start, graph build, (greedy), each refinement round, report.
    bar = _progress(3 + (method in ("metis", "metis+refine")) + (rounds if refining else 0),
                    f"partition {method} into {nparts}", progress)
    bar.set_postfix_str("start")

    if method == "hash":
        start = baselines.hash_plan(n, num_rows, nparts)
        dp, ep = start.data_partition, start.embed_partition
    elif method in ("random", "refine"):
        dp = baselines.balanced_random(n, nparts, rng)
        ep = baselines.balanced_random(num_rows, nparts, rng)
    else:
        t = time.perf_counter()
        dp, ep, extra["metis"] = metis_start(
            ids, num_rows, nparts, seed=seed, max_edges=metis_max_edges, batch_size=batch_size,
            threads=nthreads,
        )
        timings["metis_s"] = time.perf_counter() - t
        log.info("partition metis %s", extra["metis"])
    bar.update(1)
    bar.set_postfix_str("graph")

    t = time.perf_counter()
    refiner = native().Refiner(
        ids, dp, ep, nparts, num_rows, batch_size, topo, theta=theta, threads=nthreads
    )
    timings["graph_s"] = time.perf_counter() - t
    bar.update(1)
    if method in ("metis", "metis+refine"):
        bar.set_postfix_str("greedy placement")
        t = time.perf_counter()
        extra["greedy_placed"] = {
            "samples": int(refiner.assign_data()),
            "rows": int(refiner.assign_embed()),
        }
        timings["greedy_s"] = time.perf_counter() - t
        bar.update(1)
    m = refiner.samples_per_part
    history = [_cost(refiner, m, batch_size, topo, nthreads)]
    if refining:
        t = time.perf_counter()
        for r in range(rounds):
            moved_d = refiner.refine_data()
            moved_e = refiner.refine_embed()
            history.append(_cost(refiner, m, batch_size, topo, nthreads))
            log.info(
                "partition round=%d moved_samples=%d moved_rows=%d cost_per_step=%.1f "
                "elapsed_s=%.1f", r + 1, moved_d, moved_e, history[-1],
                time.perf_counter() - t0,
            )
            bar.set_postfix_str(f"round {r + 1}: cost {history[-1]:.0f}")
            bar.update(1)
        timings["refine_s"] = time.perf_counter() - t
    data_part = np.array(refiner.data_partition(), dtype=np.int32)
    embed_part = np.array(refiner.embed_partition(), dtype=np.int32)
    counts = refiner.counts()

    t = time.perf_counter()
    bar.set_postfix_str("mirrors and report")
    limit_rate = max(max_mirror_rate, 0.1)  # the report needs store rates up to 0.1
    mirrors, gains = rank_mirrors(
        ids, data_part, embed_part, nparts, batch_size=batch_size, topo=topo,
        max_mirror_rate=limit_rate, num_rows=num_rows, counts=counts, threads=nthreads,
    )
    keep = int(round(max_mirror_rate * num_rows))
    report = quality_report(
        ids, data_part, embed_part, nparts, batch_size=batch_size, topo=topo, num_rows=num_rows,
        counts=counts, mirror_gains=gains, threads=nthreads,
    )
    mirrors = [mir[:keep] for mir in mirrors]
    del refiner, counts
    report["cost_history"] = history
    log.info("partition %s", summary_line(method, report))
    if report_baselines:
        report["baselines"] = {}
        for name in ("random", "hash"):
            if name == method:
                continue
            base = (baselines.hash_plan(n, num_rows, nparts) if name == "hash"
                    else baselines.random_plan(n, num_rows, nparts, seed))
            rep = quality_report(
                ids, base.data_partition, base.embed_partition, nparts, batch_size=batch_size,
                topo=topo, num_rows=num_rows, threads=nthreads,
            )
            rep.pop("workers")
            report["baselines"][name] = rep
            log.info("partition %s", summary_line(name, rep))
    timings["report_s"] = time.perf_counter() - t
    bar.update(1)
    bar.close()
    timings["wall_s"] = time.perf_counter() - t0
    meta: dict[str, Any] = {
        "method": method,
        "seed": seed,
        "batch_size": batch_size,
        "rounds": rounds if method in ("refine", "metis+refine") else 0,
        "threads": nthreads,
        "theta": theta,
        "intra_cost": intra_cost,
        "gpus_per_node": gpus_per_node,
        "cost_matrix": topo,
        "max_mirror_rate": max_mirror_rate,
        "num_samples": n,
        "num_rows": num_rows,
        "quality": report,
        "timing": {**timings, "peak_rss_mb": peak_rss_mb()},
        **extra,
    }
    return Plan(data_part, embed_part, mirrors, meta).validate()


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
    """Partition the training split of ``ds`` into ``nparts`` workers (see module docstring)."""
    plan = partition_ids(
        ds.train.sparse, ds.meta.num_embeddings, nparts, method=method, batch_size=batch_size,
        seed=seed, threads=threads, rounds=rounds, intra_cost=intra_cost,
        gpus_per_node=gpus_per_node, max_mirror_rate=max_mirror_rate, theta=theta,
        metis_max_edges=metis_max_edges, report_baselines=report_baselines, progress=progress,
    )
    plan.meta["dataset_fingerprint"] = ds.fingerprint
    plan.meta["dataset"] = str(ds.root)
    return plan
