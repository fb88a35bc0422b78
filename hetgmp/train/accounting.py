"""What the trainer counts between TRAIN lines, and how it times training without host syncs.

Per step the loss sum and the correct count stay on the device (copied into a float64 row per
step: one small kernel, as the running sum it replaced; no host sync, and the same under CUDA
graph replay, since the copy is queued after the replay that wrote the step's outputs); the host
reads the rows once per TRAIN line, sums them in step order (equal to the old per-step
``float()`` accumulation exactly) and so also knows the first step whose loss was not finite. A step's ``perf_counter`` time means nothing on a GPU that has not
finished it, so :class:`TrainClock` times *segments* of steps between synchronized boundaries:
TRAIN lines, evaluations, checkpoints, the end of warm-up and the end of training.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Iterator

import torch

from hetgmp.comm.collectives import all_reduce_sum
from hetgmp.comm.env import DistEnv


def global_batch_sizes(counts: list[int], batch_size: int, step_in_epoch: int) -> int:
    """Samples all ranks together process at ``step_in_epoch`` (ranks hold ``counts`` samples)."""
    return sum(min(batch_size, max(0, c - step_in_epoch * batch_size)) for c in counts)


def synchronize(device: torch.device) -> None:
    """Wait until ``device`` has run everything queued so far (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_CHUNK = 256  # steps per device buffer of per-step stats (16 bytes a step)


class DivergedError(RuntimeError):
    """A training step's loss was not finite: the weights are NaN from there on."""


class Interval:
    """Accumulators between two TRAIN lines: per-step stats on the device, counts on the host."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._rows: list[torch.Tensor] = []  # [_CHUNK, 2] float64: a step's loss sum, correct
        self._step_ids: list[int] = []  # the step number of each row
        self.samples = 0
        self.global_samples = 0
        self.steps = 0
        self.epoch = 0  # epoch of the interval's last step (0 = first pass over the samples)
        self.data_wait_s = 0.0  # host time the steps waited for their batch

    def add(
        self, stats: torch.Tensor, samples: int, global_samples: int, epoch: int, step: int
    ) -> None:
        """Count step ``step``; ``stats`` = [loss sum, correct] of this rank (device, no sync)."""
        k = self.steps % _CHUNK
        if k == 0:
            self._rows.append(torch.empty(_CHUNK, 2, dtype=torch.float64, device=self.device))
        self._rows[-1][k].copy_(stats)
        self._step_ids.append(step)
        self.samples += samples
        self.global_samples += global_samples
        self.steps += 1
        self.epoch = epoch

    def totals(self) -> tuple[float, float, int | None]:
        """(loss sum, correct, the first step whose loss is not finite or None): one read of
        the device (waits for it), the sums in step order."""
        if not self.steps:
            return 0.0, 0.0, None
        rows = torch.cat(self._rows)[: self.steps].tolist()
        loss = correct = 0.0
        bad = None
        for (lo, co), step in zip(rows, self._step_ids, strict=True):
            loss += lo
            correct += co
            if bad is None and not math.isfinite(lo):
                bad = step
        return loss, correct, bad


def first_nonfinite(env: DistEnv, bad: int | None) -> tuple[int, int] | None:
    """(Collective) the first (step, rank) with a non-finite loss over all ranks, given this
    rank's first (``bad``, or None), or None: each rank's step in its own slot of one
    all-reduce (no pickle)."""
    steps = torch.zeros(env.world_size, dtype=torch.float64, device=env.device)
    steps[env.rank] = 0 if bad is None else bad
    seen = [(int(s), r) for r, s in enumerate(all_reduce_sum(env, steps).tolist()) if s > 0]
    return min(seen) if seen else None


def stop_if_diverged(
    env: DistEnv, iv: Interval, loss: float = math.nan, *, at: int | None = None
) -> None:
    """(Collective) raise :class:`DivergedError` naming the first step of ``iv`` with a
    non-finite loss on any rank; ``at``: the reduced loss already is not finite, so raise
    anyway (a sum of finite losses that overflowed), naming step ``at``."""
    found = first_nonfinite(env, iv.totals()[2])
    if found is not None:
        raise diverged(*found, loss)
    if at is not None:
        raise diverged(at, env.rank, loss)


def diverged(step: int, rank: int, loss: float) -> DivergedError:
    """The error for a first non-finite loss at ``step`` (on ``rank``'s batch)."""
    return DivergedError(
        f"the loss is {loss} at step {step} (rank {rank}'s batch): training stopped there, "
        "since every step after it trains on NaN weights (nothing after it is checkpointed). "
        "Look for inf or NaN in the data set's dense features (hetgmp preprocess refuses "
        "them; arrays written by other means may hold them) or lower --lr"
    )


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
        # each TRAIN interval's (global samples/s, epoch at its end): steady_interval_speed
        self.intervals: list[tuple[float, int]] = []

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

    def steady_interval_speed(self) -> float | None:
        """The median TRAIN interval's speed among those after the first that hold no epoch
        start (their epoch is the previous interval's): the step's steady pace, without the
        warm-up, graph captures and epoch-start scans a short run's ``speed`` carries (how
        ``bench/gpu/read_ahead_ab.sh`` reads the logs); None when no interval qualifies."""
        iv = self.intervals
        clean = [v for i, (v, ep) in enumerate(iv) if i > 0 and ep == iv[i - 1][1] and v > 0]
        return statistics.median(clean) if clean else None

    def speeds(self) -> dict[str, float | None]:
        """``speed`` / ``warmup_speed`` (global samples per second), the steady intervals'
        median (``interval_speed``) and the timed seconds."""
        t = self.timing
        steady_steps = max(0, self.steps_run - self.warmup_steps)
        return {
            "speed": t["steady_samples"] / t["steady_s"] if t["steady_s"] > 0 else None,
            "interval_speed": self.steady_interval_speed(),
            "warmup_speed": t["warmup_samples"] / t["warmup_s"] if t["warmup_s"] > 0 else None,
            "train_seconds": t["warmup_s"] + t["steady_s"],
            "data_wait_ms": 1e3 * self.steady_data_wait_s / steady_steps if steady_steps else None,
        }
