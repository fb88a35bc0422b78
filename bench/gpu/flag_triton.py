"""Diagnosis only (``ablations.py`` ``replica_flag``): a one-way signal between two ranks'
peer memory, instead of a barrier both must reach. The sender writes its rows into the
peer's buffer, then :func:`signal` stores its step count into the peer's flag (release, system
scope); the receiver's :func:`wait` spins until its own flag reaches its count (acquire). A
wait a step after the send finds the flag set: no rank waits for another's arrival, which a
barrier on the step's critical path does (``bench/results/gpu/lean_ceiling_s22/``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _signal_kernel(flag_ptr, seq_ptr):
    s = tl.load(seq_ptr)
    tl.atomic_xchg(flag_ptr, s, sem="release", scope="sys")


@triton.jit
def _wait_kernel(flag_ptr, seq_ptr):
    s = tl.load(seq_ptr)
    v = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    while v < s:
        v = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")


def signal(peer_flag: torch.Tensor, seq: torch.Tensor) -> None:
    """Store ``seq`` (int64, one element, this rank's) into ``peer_flag`` (the peer's)."""
    _signal_kernel[(1,)](peer_flag, seq, num_warps=1)


def wait(flag: torch.Tensor, seq: torch.Tensor) -> None:
    """Spin until ``flag`` (this rank's, written by the peer) reaches ``seq``."""
    _wait_kernel[(1,)](flag, seq, num_warps=1)
