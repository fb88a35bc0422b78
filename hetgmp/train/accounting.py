"""What the trainer counts between TRAIN lines, and how it times training without host syncs.

Per step the loss sum and the correct count stay on the device (added into a float64 tensor in
step order, so the sums equal the old per-step ``float()`` accumulation exactly); the host reads
them once per TRAIN line. A step's ``perf_counter`` time means nothing on a GPU that has not
finished it, so :class:`TrainClock` times *segments* of steps between synchronized boundaries:
TRAIN lines, evaluations, checkpoints, the end of warm-up and the end of training.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch


def global_batch_sizes(counts: list[int], batch_size: int, step_in_epoch: int) -> int:
    """Samples all ranks together process at ``step_in_epoch`` (ranks hold ``counts`` samples)."""
    return sum(min(batch_size, max(0, c - step_in_epoch * batch_size)) for c in counts)


def synchronize(device: torch.device) -> None:
    """Wait until ``device`` has run everything queued so far (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Interval:
    """Accumulators between two TRAIN lines: sums on the device, counts on the host."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, correct
        self.samples = 0
        self.global_samples = 0
        self.steps = 0
        self.epoch = 0  # epoch of the interval's last step (0 = first pass over the samples)
        self.data_wait_s = 0.0  # host time the steps waited for their batch

    def add(self, stats: torch.Tensor, samples: int, global_samples: int, epoch: int) -> None:
        """Count one step; ``stats`` = [loss sum, correct] of this rank (device, no sync)."""
        self.sums += stats
        self.samples += samples
        self.global_samples += global_samples
        self.steps += 1
        self.epoch = epoch


class TrainClock:
    """Training seconds and samples, warm-up apart, measured between synchronized boundaries."""

    def __init__(self, device: torch.device, warmup_steps: int) -> None:
        self.device = device
        self.warmup_steps = warmup_steps
        self.steps_run = 0
        self.timing = {"warmup_s": 0.0, "warmup_samples": 0, "steady_s": 0.0, "steady_samples": 0}
        self.steady_data_wait_s = 0.0
        self.interval_s = 0.0  # seconds since the last take_interval()
        self._t0: float | None = None
        self._samples = 0  # global samples of the running segment
        self._steps = 0  # steps of the running segment

    @property
    def in_warmup(self) -> bool:
        return self.steps_run < self.warmup_steps

    def resume(self) -> None:
        """Start a segment (after the device has finished what came before it)."""
        if self._t0 is None:
            synchronize(self.device)
            self._t0 = time.perf_counter()
            self._samples = 0
            self._steps = 0

    def pause(self) -> None:
        """End the running segment: synchronize, then book its time to warm-up or steady."""
        if self._t0 is None:
            return
        synchronize(self.device)
        dt = time.perf_counter() - self._t0
        self._t0 = None
        if self._steps == 0:  # nothing trained in it (e.g. a run resumed at its last step)
            return
        # A segment never straddles the end of warm-up (count() cuts it there).
        key = "warmup" if self.steps_run <= self.warmup_steps else "steady"
        self.timing[f"{key}_s"] += dt
        self.timing[f"{key}_samples"] += self._samples
        self.interval_s += dt

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside the block (logging, evaluation, checkpoints) is not training."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def count(self, global_samples: int, data_wait_s: float) -> None:
        """One step ran; at the end of warm-up the segment is cut (one synchronization)."""
        if not self.in_warmup:
            self.steady_data_wait_s += data_wait_s
        self.steps_run += 1
        self._steps += 1
        self._samples += global_samples
        if self.steps_run == self.warmup_steps:
            self.pause()
            self.resume()

    def take_interval(self) -> float:
        """Seconds booked since the last call (the running segment must be paused)."""
        out, self.interval_s = self.interval_s, 0.0
        return out

    def speeds(self) -> dict[str, float | None]:
        """``speed`` / ``warmup_speed`` (global samples per second) and the timed seconds."""
        t = self.timing
        steady_steps = max(0, self.steps_run - self.warmup_steps)
        return {
            "speed": t["steady_samples"] / t["steady_s"] if t["steady_s"] > 0 else None,
            "warmup_speed": t["warmup_samples"] / t["warmup_s"] if t["warmup_s"] > 0 else None,
            "train_seconds": t["warmup_s"] + t["steady_s"],
            "data_wait_ms": 1e3 * self.steady_data_wait_s / steady_steps if steady_steps else None,
        }
