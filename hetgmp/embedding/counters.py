"""Communication and read-path counters of the embedding runtime."""

from __future__ import annotations

KINDS = ("ids", "versions", "values", "gradients")
ROW_KINDS = ("owned", "mirror_fresh", "mirror_stale_ok", "remote")

COUNTER_NAMES = (
    *(f"bytes_sent_{k}" for k in KINDS),
    *(f"bytes_recv_{k}" for k in KINDS),
    *(f"rows_{k}" for k in ROW_KINDS),
    "rows_requested",  # unique ids looked up (= owned + mirror_fresh + mirror_stale_ok + remote)
    "rows_mirror_refreshed",  # mirrors beyond the bound, refetched (counted in rows_remote)
    "pushes_sent",  # rows whose gradients were sent to their owner
    "pushes_deferred",  # mirror rows holding updates that the bound let them keep
    "steps",
)


def zero_counters() -> dict[str, int]:
    return dict.fromkeys(COUNTER_NAMES, 0)


def format_counters(c: dict[str, int]) -> str:
    """One parseable ``key=value`` log line."""
    return " ".join(f"{k}={c[k]}" for k in COUNTER_NAMES if k in c)
