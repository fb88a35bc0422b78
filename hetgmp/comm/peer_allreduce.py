"""The dense gradients' all-reduce over NVLink peer memory (symmetric memory), for CUDA ranks
of one host: the gradient bucket lives in a :class:`~hetgmp.comm.peer_memory.PeerMemory`
allocation and is summed in place by torch's two-shot kernel (each rank reduces its share of
the buffer from every peer's copy and writes the sum into every peer's, then a device barrier),
instead of NCCL's all-reduce.

Why: in the 2-GPU step at batch 8192 the dense all-reduce (~1M parameters, 4 MB) ran as
NCCL's ring LL kernel for 42 us on the path from backward to Adam to the next forward, beside
the exchange's chain (``bench/results/gpu/scaling_diagnosis/timeline_8192_peer/``); cutting
the chain alone did not move the step (``read_ahead_ab.sh`` variants narrow / ownearly / chain,
2026-11-27), so both paths after backward count. Reading 2 MB from a peer and writing 2 MB to
it over NVLink takes a few microseconds.

The sum of two float32 values is the same in any order, so on 2 ranks the result equals
NCCL's bit for bit (``tests/gpu_dense_allreduce_check.py``); on more ranks the order of the
adds may differ from NCCL's ring (rounding only).

Switched by :data:`DENSE_PEER` (off until measured: ``read_ahead_ab.sh`` variant ``dar``).
Where the ranks cannot share peer memory, or on CPU (gloo) ranks, the bucket takes the
group's all-reduce (:attr:`PeerAllReduce.how` says why).
"""

from __future__ import annotations

import warnings

import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.peer_memory import PeerMemory, PeerMemoryRefused, PeerMemoryUnavailable

DENSE_PEER = False
# (the kernel's vector accesses: the buffer's length rounded up to this many elements)
QUANTUM = 1024


class PeerAllReduce:
    """A flat buffer of ``numel`` ``dtype`` elements in peer memory (:attr:`flat`) and its
    in-place sum over the ranks of ``env`` (collective to construct: every rank alike)."""

    def __init__(self, env: DistEnv, numel: int, dtype: torch.dtype) -> None:
        padded = max(QUANTUM, -(-numel // QUANTUM) * QUANTUM)
        self.pm = PeerMemory(env, {"grads": ((padded,), dtype)})
        self.padded = self.pm.mine("grads")
        self.flat = self.padded[:numel]
        self.group_name = env.group.group_name

    def all_reduce(self) -> None:
        """Every rank's buffer replaced by the sum over ranks (on the current stream;
        capturable in a CUDA graph)."""
        torch.ops.symm_mem.two_shot_all_reduce_(self.padded, "sum", self.group_name)


def peer_all_reduce(
    env: DistEnv, numel: int, dtype: torch.dtype
) -> tuple[PeerAllReduce | None, str]:
    """(Collective) a :class:`PeerAllReduce` when :data:`DENSE_PEER` is on and the CUDA ranks
    of ``env`` share peer memory, else None; and how the dense gradients are summed (for the
    log)."""
    if not DENSE_PEER or env.group is None or env.world_size < 2 or numel == 0:
        return None, "the group's all-reduce"
    if env.device.type != "cuda" or env.backend != "nccl":
        return None, "the group's all-reduce (peer memory: CUDA ranks on NCCL)"
    if dtype not in (torch.float32, torch.bfloat16):
        return None, f"the group's all-reduce (peer memory: float32 or bfloat16, not {dtype})"
    try:
        return PeerAllReduce(env, numel, dtype), "summed in peer memory (two-shot, NVLink)"
    except PeerMemoryRefused as e:
        return None, f"the group's all-reduce (no peer memory: {e})"
    except PeerMemoryUnavailable as e:  # (an allocation failed, on every rank alike)
        warnings.warn(f"dense gradients: the group's all-reduce: {e}", stacklevel=2)
        return None, f"the group's all-reduce (no peer memory: {e})"
