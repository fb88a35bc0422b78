"""Turn the embedding's raw counters into the figures a log line shows.

The table counts bytes by kind and rows by where they were read from (see
``DistributedEmbedding.counters``); the trainer sums them over ranks and over a log interval.
Here they become *bytes per sample* (all bytes sent, over global samples) and the *mirror hit
rate* (rows served by a local mirror, over all non-owned rows read); with rows in host memory
(``--rows-on host``) the host tier's ``tier_*`` counters become its cache hit rate, evictions
and bytes moved each way per step (:func:`tier_summary`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _sum(counters: dict[str, float], pred: Callable[[str], bool]) -> float:
    return float(sum(v for k, v in counters.items() if pred(k)))


def summarize_counters(counters: dict[str, float], samples: int | None) -> dict[str, Any]:
    """``bytes_per_sample`` (when ``samples`` is given) and ``mirror_hit`` from raw counters."""
    out: dict[str, Any] = {}
    if not counters:
        return out
    sent = _sum(counters, lambda k: k.startswith("bytes_sent"))
    if samples:
        out["bytes_per_sample"] = sent / samples
    else:
        out["bytes_sent"] = sent
    # rows_mirror_refreshed is already counted in rows_remote: hits are fresh or allowed-stale.
    mirror = float(counters.get("rows_mirror_fresh", 0) + counters.get("rows_mirror_stale_ok", 0))
    remote = float(counters.get("rows_remote", 0))
    if mirror + remote > 0:
        out["mirror_hit"] = mirror / (mirror + remote)
    if "tier_hits" in counters:  # (the TRAIN line's short names)
        t = tier_summary(counters)
        out.update(tier_hit=t["hit_rate"], tier_evictions=t["evictions"])
        out.update(tier_h2d_per_step=t["bytes_h2d_per_step"])
        out.update(tier_d2h_per_step=t["bytes_d2h_per_step"])
    return out


def tier_summary(counters: dict[str, float]) -> dict[str, float]:
    """The host tier's figures from raw ``tier_*`` counters (any interval): distinct rows hit
    and missed in the device cache and the hit rate, rows evicted and written back, bytes
    host -> device and back per step (a step: a batch made resident), the steps, and how many
    batches were made resident ahead of their step (``ahead``) or at it (``ahead_skipped``)."""
    c = {k[len("tier_") :]: float(v) for k, v in counters.items() if k.startswith("tier_")}
    seen = c.get("hits", 0.0) + c.get("misses", 0.0)
    steps = c.get("batches", 0.0)
    return {
        "hits": c.get("hits", 0.0), "misses": c.get("misses", 0.0),
        "hit_rate": c.get("hits", 0.0) / seen if seen else 1.0,
        "evictions": c.get("evictions", 0.0), "written_back": c.get("written_back", 0.0),
        "bytes_h2d_per_step": c.get("bytes_h2d", 0.0) / steps if steps else 0.0,
        "bytes_d2h_per_step": c.get("bytes_d2h", 0.0) / steps if steps else 0.0,
        "steps": steps, "ahead": c.get("ahead", 0.0), "ahead_skipped": c.get("ahead_skipped", 0.0),
    }  # fmt: skip
