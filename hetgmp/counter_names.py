"""The embedding runtime's counter names (:mod:`hetgmp.embedding.counters` counts them).

Here, in a module that imports nothing heavy, so that what only reads results (the
experiments' tables and plots, reports) does not import torch for them.
"""

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
    "pushes_capacity_deferred",  # due mirror pushes kept a step for want of payload room
    "steps",
)
