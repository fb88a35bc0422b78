"""Clocks for the benchmark: per-step timing, per-phase profile, copy bandwidth, machine facts.

On CUDA every measurement uses ``torch.cuda.Event`` pairs on the current stream (read after one
synchronisation at the end), so timing adds no host syncs to the step; on CPU the host clock is
exact because every op is synchronous.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

# The runtime's phase names (hetgmp.embedding.profile.PHASES) -> the report's names.
PHASE_ALIASES = {"unique": "preprocess", "gather": "lookup"}


def _now(cuda: bool) -> Any:
    """A point in time: a recorded CUDA event on GPU (read after a sync), else the host clock."""
    if cuda:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev
    return time.perf_counter()


class Phases:
    """Split steps into named phases (duck-types ``hetgmp.embedding.profile.PhaseTimer``).

    ``begin()`` opens a step, ``mark(phase)`` closes the interval since the previous mark and
    charges it to ``phase``; ``end()`` closes the step. ``start()`` (what the runtime calls at the
    top of its forward) is a mark charged to ``preprocess``, so nothing between our ``begin`` and
    the runtime's own start is lost. Disabled (``enabled=False``) every call is a no-op.
    """

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.device, self.enabled = device, enabled
        self.cuda = device.type == "cuda"
        self.seconds: dict[str, float] = {}
        self.steps = 0
        self._marks: list[tuple[str, Any]] = []

    def _now(self) -> Any:
        return _now(self.cuda)

    def begin(self) -> None:
        if self.enabled:
            self._marks = [("", self._now())]

    def start(self) -> None:
        self.mark("preprocess")

    def mark(self, phase: str) -> None:
        if self.enabled and self._marks:
            self._marks.append((PHASE_ALIASES.get(phase, phase), self._now()))

    def end(self) -> None:
        if not self.enabled or not self._marks:
            return
        if self.cuda:
            torch.cuda.synchronize(self.device)
        for (_, a), (phase, b) in zip(self._marks, self._marks[1:], strict=False):
            s = a.elapsed_time(b) / 1e3 if self.cuda else b - a
            self.seconds[phase] = self.seconds.get(phase, 0.0) + s
        self.steps += 1
        self._marks = []

    def reset(self) -> None:
        self.seconds, self.steps, self._marks = {}, 0, []

    def ms_per_step(self) -> dict[str, float]:
        return {k: 1e3 * v / max(1, self.steps) for k, v in self.seconds.items()}


class StepClock:
    """Wall time of each step: CUDA events on GPU, host clock on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.cuda = device, device.type == "cuda"
        self._pairs: list[tuple[Any, Any]] = []

    def _now(self) -> Any:
        return _now(self.cuda)

    def tick(self) -> Any:
        return self._now()

    def tock(self, start: Any) -> None:
        self._pairs.append((start, self._now()))

    def seconds(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return [a.elapsed_time(b) / 1e3 for a, b in self._pairs]
        return [b - a for a, b in self._pairs]


def interleaved_seconds(fns: dict[str, Any], reps: int, dev: torch.device) -> dict[str, float]:
    """Median seconds per call of each of ``fns``, after one warm-up call each (Triton
    compiles there); the calls interleaved round by round, since the machines are shared."""
    for f in fns.values():
        f()
    clocks = {k: StepClock(dev) for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t0 = clocks[k].tick()
            f()
            clocks[k].tock(t0)
    return {k: median(c.seconds()) for k, c in clocks.items()}


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def copy_bandwidth(device: torch.device, nbytes: int | None = None, reps: int = 10) -> float:
    """Measured device-memory copy bandwidth in bytes/s (read + write counted: 2 x size)."""
    if nbytes is None:
        nbytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    clock = StepClock(device)
    for _ in range(reps):
        t = clock.tick()
        dst.copy_(src)
        clock.tock(t)
    secs = median(clock.seconds())
    del src, dst
    return 2.0 * n * 4 / secs


def embedding_floor_bytes(batch: int, fields: int, dim: int, unique_rows: float) -> float:
    """HBM bytes one GPU must move per embedding step (fp32 rows), counted generously low.

    lookup: read the batch's unique rows and write the ``[B, F, D]`` output; backward: read the
    output gradient; update: read and write every touched row once (the summed-gradient
    scratch and the ids are ignored). Any implementation moves at least this much.
    """
    row = 4.0 * dim
    return batch * fields * row * 2.0 + unique_rows * row * 3.0


def machine_info(device: torch.device) -> dict[str, Any]:
    """GPU model, versions, host, date: what the results table is stamped with."""
    info: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpu_count"] = torch.cuda.device_count()
        info["gpu_mem_gib"] = round(
            torch.cuda.get_device_properties(device).total_memory / 2**30, 1
        )
        try:
            v = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as err:  # noqa: BLE001 - informational only
            info["nccl"] = f"unknown ({err})"
    else:
        info["gpu"] = None
    return info


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
