"""CPU threads of a training process (issue 32 item 3): ``--threads``, and what ``0`` picks.

Measured on the shared 2-core box (``bench/bench_threads.py``, ``bench/results/threads_cpu2.md``):
side by side in one run, a one-process run with two torch threads went anywhere from 1.6x
faster to 37x slower than with one, depending on what the other engineers' tests ran at that
moment; one thread stayed put. So ``--threads 0`` gives each rank its share of the cores the
load average leaves free (at least one), and the log says what it picked and why.
"""

from __future__ import annotations

import os

import torch

from hetgmp.comm.env import DistEnv
from hetgmp.train.config import TrainConfig


def set_threads(cfg: TrainConfig, env: DistEnv) -> str | None:
    """CPU threads per rank; on CUDA the float32 matmul precision (TF32 by default: torch's
    own default, full fp32, ran the WDL MLP at ~25 TFLOP/s on an H200, issue 14). Returns the
    log line saying what was picked (CPU)."""
    line = apply_threads(env, cfg.threads, cfg.matmul_precision)
    if line is not None and cfg.prefetch_batches and cfg.data_on_device != "on":
        line += f"; batches gathered by a reader thread (--prefetch-batches {cfg.prefetch_batches})"
    return line


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (what ``taskset``, Slurm's cgroup
    or ``mpirun --bind-to core`` leave it), not the machine's count; ``os.cpu_count`` counted
    every core of the box, so a rank bound to one core ran two or more threads on it."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # (not every platform has it)
        return os.cpu_count() or 1


def default_threads(world_size: int) -> tuple[int, str]:
    """``--threads 0``: torch intra-op threads per rank from the cores and the box's load.

    Each rank gets its share of the cores **not already busy** (1-minute load average, taken
    before this job computes), at least one: on the shared 2-core box two threads ran one
    process anywhere from 1.6x faster to 37x slower than one thread, depending on what else
    ran (an OpenMP thread whose core is taken stalls every parallel region), while one thread
    stayed within a few percent (bench/results/threads_cpu2.md). Returns (threads, why)."""
    cores = usable_cores()
    share = max(1, cores // max(1, world_size))
    try:
        load = os.getloadavg()[0]
    except OSError:  # (not every platform has it)
        return share, f"{cores} cores / {world_size} rank(s)"
    free = max(0.0, cores - load)
    n = max(1, min(share, int(free // max(1, world_size))))
    return n, (
        f"{cores} cores / {world_size} rank(s), load average {load:.1f} leaves {free:.1f} free"
    )


def apply_threads(env: DistEnv, threads: int = 0, matmul_precision: str = "high") -> str | None:
    """:func:`set_threads` from its two values (0 threads: :func:`default_threads`); the log
    line saying what was picked on CPU (None on other devices)."""
    if env.device.type == "cuda":
        torch.set_float32_matmul_precision(matmul_precision)
        torch.backends.cudnn.allow_tf32 = matmul_precision != "highest"
    if env.device.type != "cpu":
        return None
    if threads:
        n, why = threads, "--threads"
    else:
        n, why = default_threads(env.world_size)
        why = f"--threads 0: {why}; --threads N overrides"
    torch.set_num_threads(n)
    return f"threads: {n} torch intra-op thread(s) per rank ({why})"
