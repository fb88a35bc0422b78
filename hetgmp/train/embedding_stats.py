"""Turn the embedding's raw counters into the figures a log line shows.

The table counts bytes by kind and rows by where they were read from (see
``DistributedEmbedding.counters``); the trainer sums them over ranks and over a log interval.
Here they become *bytes per sample* (all bytes sent, over global samples) and the *mirror hit
rate* (rows served by a local mirror, over all non-owned rows read).
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
    return out
