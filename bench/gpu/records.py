"""One configuration's result record, from what every rank measured.

Throughput is the global batch over the median over steps of the slowest rank's step time;
bytes are what ranks sent to other ranks, summed over ranks, per global sample; phases are
averaged over ranks; the rows share splits the looked-up rows by where they were served from.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .timing import embedding_floor_bytes, median

ROW_KINDS = ("rows_owned", "rows_mirror_fresh", "rows_mirror_stale_ok", "rows_remote")


def result_record(
    everyone: list[dict[str, Any]],
    mine: dict[str, Any],
    *,
    contender: str,
    world: int,
    mode: str,
    model_name: str,
    precision: str,
    batch: int,
    dim: int,
    steps: int,
    warmup: int,
    cuda: bool,
) -> dict[str, Any]:
    """The record of one configuration from every rank's ``{"secs", "sent", "rows", "phases",
    "peak"}`` (:meth:`Runner.measure`), without the embedding-only floor. ``mine`` is this
    rank's entry: its byte kinds and row counters decide which ones the record lists."""
    gb = batch * world
    slowest = [max(r["secs"][i] for r in everyone) for i in range(steps)]
    step_s = median(slowest)
    total_sent = {kind: sum(r["sent"][kind] for r in everyone) for kind in mine["sent"]}
    samples = steps * gb
    phase_names = sorted({p for r in everyone for p in r["phases"]})
    rec: dict[str, Any] = {
        "contender": contender,
        "world": world,
        "mode": mode,
        "model": model_name if mode == "train" else None,
        "precision": precision if mode == "train" else None,
        "batch_per_gpu": batch,
        "dim": dim,
        "steps": steps,
        "warmup": warmup,
        "samples_per_s": gb / step_s,
        "step_ms_median": 1e3 * step_s,
        "step_ms_mean": 1e3 * float(np.mean(slowest)),
        "step_ms_min": 1e3 * float(np.min(slowest)),
        "phases_ms": {
            p: float(np.mean([r["phases"].get(p, 0.0) for r in everyone])) for p in phase_names
        },
        "bytes_per_sample": sum(total_sent.values()) / samples,
        "bytes_per_sample_by_kind": {kind: v / samples for kind, v in total_sent.items()},
        "peak_mem_gib": max((r["peak"] or 0.0) for r in everyone) if cuda else None,
    }
    if mine["rows"]:
        rec["rows_share"] = rows_share(everyone)
    return rec


def rows_share(everyone: list[dict[str, Any]]) -> dict[str, float]:
    """Share of the requested rows served from each place (owned, fresh / stale mirror,
    remote), summed over ranks."""
    req = sum(r["rows"].get("rows_requested", 0) for r in everyone)
    return {
        key[5:]: sum(r["rows"].get(key, 0) for r in everyone) / max(1, req) for key in ROW_KINDS
    }


def add_floor(rec: dict[str, Any], *, fields: int, unique_rows: float, copy_bw: float) -> None:
    """Add the embedding-only HBM floor (the bytes a step must move at the measured copy
    bandwidth) and the record's percentage of it."""
    batch, dim = rec["batch_per_gpu"], rec["dim"]
    gb = batch * rec["world"]
    floor_b = embedding_floor_bytes(batch, fields, dim, unique_rows)
    rec["floor"] = {
        "unique_rows_per_gpu_batch": unique_rows,
        "hbm_bytes_per_gpu_step": floor_b,
        "copy_bandwidth_gbs": copy_bw / 1e9,
        "step_ms": 1e3 * floor_b / copy_bw,
        "samples_per_s": gb * copy_bw / floor_b,
    }
    rec["pct_of_floor"] = 100.0 * rec["samples_per_s"] / rec["floor"]["samples_per_s"]
