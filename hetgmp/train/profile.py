"""``--profile-steps N``: per-phase times of N steps after warm-up, for the benchmark.

A step marks its phase boundaries (``start``, ``data``, ``fwd_bwd``, ``sync``, ``opt``); the
embedding's forward is bracketed by hooks on ``model.embedding`` (``emb_start`` / ``emb_end``),
so the embedding package needs no change. On CUDA a mark records an event (read once, after
the last profiled step: no host sync inside the window); on CPU it reads ``perf_counter``.
``data_wait`` is the host time the step waited for its batch. Results are per-step means in ms:

- ``embedding``: the embedding's forward (lookup and exchange);
- ``dense_fwd_bwd``: from the batch's arrival to the end of backward, minus ``embedding``;
- ``sync``: the dense-gradient all-reduce; ``optimizers``: the dense optimizer step and zeroing;
- ``total``: the whole step, data wait included.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

T = TypeVar("T")
PHASES = ("data_wait", "embedding", "dense_fwd_bwd", "sync", "optimizers", "total")


class NoMarks:
    """The profiler's interface when nothing is profiled."""

    def mark(self, name: str) -> None:
        """Nothing to record."""


class PhaseProfiler:
    """Marks phases of steps ``first .. first + steps - 1`` (0-based steps run in this process)."""

    def __init__(self, device: torch.device, embedding: nn.Module, *, first: int, steps: int):
        self.device = device
        self.embedding = embedding
        self.first = first
        self.last = first + steps  # exclusive
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[str, Any]] = []
        self._steps: list[list[tuple[str, Any]]] = []
        self._waits: list[float] = []
        self._hooks: list[Any] = []
        self._active = False

    @property
    def active(self) -> bool:
        """Whether a profiled step is running."""
        return self._active

    def mark(self, name: str) -> None:
        """Record a phase boundary of the running profiled step (no-op outside one)."""
        if not self._active:
            return
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks.append((name, ev))
        else:
            self._marks.append((name, time.perf_counter()))

    def begin(self, steps_run: int) -> NoMarks | PhaseProfiler:
        """Start step ``steps_run``; returns what its phases mark (self when it is profiled)."""
        if not self.first <= steps_run < self.last:
            return NoMarks()
        if not self._hooks:
            self._hooks = [
                self.embedding.register_forward_pre_hook(lambda *_: self.mark("emb_start")),
                self.embedding.register_forward_hook(lambda *_: self.mark("emb_end")),
            ]
        self._active = True
        self._marks = []
        self.mark("start")
        return self

    def end(self, data_wait_s: float) -> None:
        """Close the running profiled step (``data_wait_s``: its host wait for the batch)."""
        if not self._active:
            return
        self._active = False
        self._steps.append(self._marks)
        self._waits.append(data_wait_s)
        if len(self._steps) == self.last - self.first:
            self.remove_hooks()

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _ms(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) if self.cuda else 1e3 * (b - a)

    def _phases(self, marks: list[tuple[str, Any]], wait_s: float) -> list[float]:
        at = {}
        emb = 0.0
        emb_start = None
        for name, t in marks:
            if name == "emb_start":
                emb_start = t
            elif name == "emb_end" and emb_start is not None:
                emb += self._ms(emb_start, t)
            else:
                at[name] = t
        fwd_bwd = self._ms(at["data"], at["fwd_bwd"])
        sync = self._ms(at["fwd_bwd"], at["sync"])
        opt = self._ms(at["sync"], at["opt"])
        total = self._ms(at["start"], at["opt"])
        return [1e3 * wait_s, emb, fwd_bwd - emb, sync, opt, total]

    def sums(self) -> tuple[int, list[float]]:
        """(profiled steps, per-phase sums in ms in :data:`PHASES` order); synchronizes."""
        if self.cuda and self._steps:
            torch.cuda.synchronize(self.device)
        sums = [0.0] * len(PHASES)
        for marks, wait in zip(self._steps, self._waits, strict=True):
            sums = [s + v for s, v in zip(sums, self._phases(marks, wait), strict=True)]
        return len(self._steps), sums


class ReplayTimer:
    """Device time of a few CUDA graph replays (``--profile-steps``: the profiled steps run
    eagerly, so a whole-step graph's own time is measured on the replays after them). Each of
    the first ``count`` calls of :meth:`replay` with ``timed`` true is bracketed by events."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def replay(self, run: Callable[[], T], *, timed: bool) -> T:
        """``run()``, timed while any of the count is left and ``timed`` is true."""
        if not timed or self.left <= 0:
            return run()
        self.left -= 1
        ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        ev[0].record()
        out = run()
        ev[1].record()
        self.events.append(ev)
        return out

    def mean_ms(self) -> float | None:
        """Mean milliseconds of the timed replays (None if none ran); synchronizes."""
        if not self.events:
            return None
        self.events[-1][1].synchronize()
        return sum(a.elapsed_time(b) for a, b in self.events) / len(self.events)
