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
def _signal_kernel(addr_ptr, seq_ptr):
    # (the peer's flag by its address, loaded: as padded/payload_triton.py reaches the peers'
    # rows, not a tensor of another device's memory handed to the launcher)
    flag = tl.load(addr_ptr).to(tl.pointer_type(tl.int64))
    s = tl.load(seq_ptr)
    tl.atomic_xchg(flag, s, sem="release", scope="sys")


@triton.jit
def _wait_kernel(flag_ptr, seq_ptr):
    s = tl.load(seq_ptr)
    v = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    while v < s:
        v = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")


def address_of(peer_flag: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``peer_flag``'s address as a one-element int64 tensor on ``device`` (made once)."""
    return torch.tensor([peer_flag.data_ptr()], dtype=torch.int64, device=device)


def signal(peer_addr: torch.Tensor, seq: torch.Tensor) -> None:
    """Store ``seq`` (int64, one element, this rank's) into the peer's flag at ``peer_addr``
    (:func:`address_of`)."""
    _signal_kernel[(1,)](peer_addr, seq, num_warps=1)


def wait(flag: torch.Tensor, seq: torch.Tensor) -> None:
    """Spin until ``flag`` (this rank's, written by the peer) reaches ``seq``."""
    _wait_kernel[(1,)](flag, seq, num_warps=1)
