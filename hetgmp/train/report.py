"""The numbers a run reports: embedding counters over ranks, memory, the results dictionary."""

from __future__ import annotations

import resource
import statistics
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hetgmp.comm.collectives import all_gather_object, all_reduce_sum
from hetgmp.comm.env import DistEnv
from hetgmp.embedding import DistributedEmbedding
from hetgmp.train.embedding_stats import summarize_counters, tier_summary
from hetgmp.train.profile import PHASES, PhaseProfiler

if TYPE_CHECKING:
    from hetgmp.train.trainer_view import TrainerView


def local_counters(embedding: nn.Module) -> dict[str, float]:
    """This rank's embedding counters (none for a table without ``counters()``)."""
    counters = getattr(embedding, "counters", None)
    return {k: float(v) for k, v in counters().items()} if callable(counters) else {}


def sum_over_ranks(env: DistEnv, values: dict[str, float]) -> dict[str, float]:
    """``values`` summed key by key over ranks (one all-reduce; same keys on every rank)."""
    keys = sorted(values)
    if not keys:
        return {}
    vec = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    vec = all_reduce_sum(env, vec)
    return dict(zip(keys, vec.tolist(), strict=True))


def global_counters(env: DistEnv, embedding: nn.Module) -> dict[str, float]:
    """The embedding counters summed over ranks (collective)."""
    return sum_over_ranks(env, local_counters(embedding))


def memory_report(env: DistEnv, embedding: nn.Module) -> dict[str, Any]:
    """Stored rows (owned + mirrors) and peak RSS per rank, max and mean over ranks."""
    own, mir = 0, 0  # (another kind of table: nothing to say)
    if isinstance(embedding, DistributedEmbedding):
        own, mir = embedding.n_own, embedding.n_mir
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB
    ranks = all_gather_object(env, (own, mir, rss_mb))
    out: dict[str, Any] = {}
    for i, name in enumerate(("owned_rows", "mirror_rows", "peak_rss_mb")):
        vals = [float(r[i]) for r in ranks]
        out[f"{name}_max"] = max(vals)
        out[f"{name}_mean"] = sum(vals) / len(vals)
    stored = [float(r[0] + r[1]) for r in ranks]
    out["stored_rows_max"] = max(stored)
    out["stored_rows_mean"] = sum(stored) / len(stored)
    return out


def tier_sizes(embedding: nn.Module) -> dict[str, int]:
    """The host tier's cache rows and bytes (device: cache + slot map; host: rows + state)."""
    tier = getattr(embedding, "tier", None)
    if tier is None:
        return {}
    mem = tier.memory()
    return {"cache_rows": tier.budget, "table_rows": tier.num_rows, "warm_rows": tier.warm_rows,
            "device_bytes": mem["device"], "host_bytes": mem["host"]}  # fmt: skip


def host_tier_results(tr: TrainerView, train: dict[str, float]) -> dict[str, Any]:
    """The host tier's figures over ranks (``train``: the training steps' counters summed
    over ranks; sizes summed too) and each rank's own under ``ranks`` (collective)."""
    emb = tr.model.embedding
    mine = {k: v - tr.eval_counters.get(k, 0.0) for k, v in local_counters(emb).items()}
    mine = {k: v for k, v in mine.items() if k.startswith("tier_")}
    ranks = all_gather_object(tr.env, (mine, tier_sizes(emb)))
    sizes = {k: sum(r[1][k] for r in ranks) for k in ranks[0][1]}
    per_rank = [{**tier_summary(c), **s} for c, s in ranks]
    return {**tier_summary(train), **sizes, "ranks": per_rank}


def step_profile(env: DistEnv, profiler: PhaseProfiler) -> dict[str, float] | None:
    """``--profile-steps``: per-step mean ms of each phase, averaged over ranks (collective)."""
    steps, sums = profiler.sums()
    if steps == 0:
        return None
    totals = sum_over_ranks(env, dict(zip(PHASES, sums, strict=True)))
    out: dict[str, float] = {k: v / (steps * env.world_size) for k, v in totals.items()}
    out["steps"] = steps
    return out


def timing_results(tr: TrainerView) -> dict[str, Any]:
    """``speed``, ``warmup_speed``, ``interval_speed`` (global samples/s; the last: the steady
    TRAIN intervals' median, ``TrainClock.steady_interval_speed``), ``data_wait_ms`` (steady
    steps' mean host wait for a batch, averaged over ranks) and the timed seconds."""
    out: dict[str, Any] = dict(tr.clock.speeds())
    wait = out.pop("data_wait_ms")
    waits = all_gather_object(tr.env, wait)
    timed = [w for w in waits if w is not None]  # (async: a rank may have run no step)
    out["data_wait_ms"] = sum(timed) / len(timed) if timed else None
    out["data_source"] = tr.data_source
    run = tr.run_step
    out["step_graph"] = tr.step_graph()  # what is captured, and why not more
    head = tr.train_step.head
    out["graph_replays"] = getattr(run, "replays", 0) + (head.replays if head else 0)
    # (steps whose rows were read one step ahead: hetgmp.embedding.padded.ahead)
    out["graph_replays_ahead"] = getattr(run, "replays_ahead", 0)
    # (steps whose plan was made one step ahead: exact)
    out["graph_replays_planned_ahead"] = getattr(run, "replays_planned", 0)
    # (steps that took rows the last step exchanged right after its backward: exact)
    out["graph_replays_exchanged_early"] = getattr(run, "replays_early", 0)
    # (epoch starts whose exchange capacities grew: buffers rebuilt, graphs captured again)
    out["capacity_growths"] = getattr(run, "growths", 0)
    # (how the padded exchange's payloads travelled: peer memory or all-to-alls, and why)
    whole = getattr(run, "whole", None)
    st = whole.padded.static if whole is not None else None
    out["exchange_payloads"] = st.payload_note if st is not None else None
    # (the epoch-start scans' seconds: counting each batch's rows per peer, not in the steps)
    out["epoch_scan_s"] = whole.scan_seconds if whole is not None else None
    # (one epoch start's, the median: the first carries Triton's compile)
    times = whole.scan_times if whole is not None else []
    out["epoch_scan_ms_median"] = 1e3 * statistics.median(times) if times else None
    # (of which the host's launches: the rest is the device's work, or work queued before it)
    launches = whole.scan_launch_times if whole is not None else []
    out["epoch_scan_launch_ms_median"] = 1e3 * statistics.median(launches) if launches else None
    # (how the dense gradients were summed: peer memory or the group's all-reduce)
    out["dense_allreduce"] = tr.train_step.bucket.how
    out["amp"] = tr.amp  # (--amp resolved: on by default with CUDA)
    return out


def results(tr: TrainerView) -> dict[str, Any]:
    """The final results of ``tr`` (collective: every rank calls it and gets the same)."""
    out: dict[str, Any] = {
        "step": tr.position.step,
        "epoch": tr.position.epoch,
        "world_size": tr.env.world_size,
        "warmup_steps": tr.clock.warmup_steps,  # (a CUDA graph with --profile-steps: more)
        **timing_results(tr),
    }
    profile = step_profile(tr.env, tr.profiler)
    if profile is not None:
        out["step_ms"] = profile
        timer = getattr(tr.run_step, "timer", None)  # (a whole-step graph's ReplayTimer)
        replay_ms = timer.mean_ms() if timer is not None else None
        if replay_ms is not None:  # (the profiled steps ran eagerly: the graph's own time)
            profile["eager"] = 1.0
            profile["graph_replay_ms"] = replay_ms
    if tr.last_eval is not None:
        out.update(tr.last_eval.fields())
    total = global_counters(tr.env, tr.model.embedding)
    out["embedding"] = summarize_counters(total, None)
    out["embedding_counters"] = total
    # Training only (evaluation's lookups excluded), for bytes per training sample.
    if total:
        ev = sum_over_ranks(tr.env, {k: tr.eval_counters.get(k, 0.0) for k in total})
        train = {k: total[k] - ev[k] for k in total}
        out["embedding_train_counters"] = train
        out["embedding_train"] = summarize_counters(train, tr.samples_seen or None)
        if "tier_hits" in train:  # (--rows-on host: the training steps' figures)
            out["host_tier"] = host_tier_results(tr, train)
    out["samples_seen"] = tr.samples_total  # (the whole run, resumes included)
    out["samples_this_process"] = tr.samples_seen
    out["memory"] = memory_report(tr.env, tr.model.embedding)
    out.update(tr.extra_results)
    return out
