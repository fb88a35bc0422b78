"""Timing a GPU call with CUDA events, for the diagnosis scripts (``uva_gather.py``,
``p2p_probe.py``)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def timed(fn: Callable[[], object], iters: int, before: Callable[[], None] | None = None) -> float:
    """Mean microseconds per call of ``fn``: CUDA events around ``iters`` calls, after three
    warm-up calls and a device sync (``before``: also run then, e.g. a barrier that lines the
    ranks up)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if before is not None:
        before()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / iters
