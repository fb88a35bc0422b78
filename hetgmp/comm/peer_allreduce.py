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

Switched by :data:`DENSE_PEER` (off: measured without gain on 2 and 4 H100s, the dense
path hid by the exchange's chain, ``bench/results/gpu/dense_allreduce/``). Where the ranks
cannot share peer memory, or on CPU (gloo) ranks, the bucket takes the group's all-reduce
(:attr:`PeerAllReduce.how` says why).

**Summed by Adam** (:data:`ADAM_PEER`): no all-reduce at all. After a device barrier (every
rank's gradient complete) each rank's fused Adam reads every rank's bucket in peer memory,
adds them in rank order (the same adds on every rank: the parameters stay bit-identical) and
updates its parameters in the same pass (:func:`hetgmp.train.adam_kernel.adam_peer_step`);
a second barrier keeps a bucket unchanged until every rank has read it. Why: after backward
the dense path (all-reduce ~40 us, Adam ~20 us at batch 8192 on 2 H100s) runs beside the
exchange's chain, and the step waits for the longer of the two
(``bench/results/gpu/ablations_tail/``); this path becomes two 5-us barriers and one pass.

**Copied, then summed by Adam** (:data:`ADAM_COPY`, with :data:`ADAM_PEER`): each rank first
copies its bucket into an inbox row of every peer's peer memory (a plain device-to-device copy:
the GPUs' copy engines move it over NVLink, no SM runs it), then the barrier; Adam then reads
only local memory (its own bucket and the inbox, in rank order: still the same adds on every
rank). Why: ``ADAM_PEER``'s kernel loads the peers' buckets over NVLink from its SMs, which made
the pass longer than the all-reduce it replaced saved (``bench/results/gpu/adam_peer/``); a
copy engine moves 4 MB in ~10 us beside whatever the SMs run.
"""

from __future__ import annotations

import warnings

import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.peer_memory import PeerMemory, PeerMemoryRefused, PeerMemoryUnavailable

DENSE_PEER = False
# The dense gradients summed by the fused Adam itself, read in peer memory (module docstring;
# with FlatAdam's Triton kernel, float32 parameters). Off: exact, but 1.66x against 1.69x on 2
# H100s at batch 8192 (bench/results/gpu/adam_peer/): the exchange's chain was the longer path.
ADAM_PEER = False
# (with ADAM_PEER) the peers' buckets copied into this rank's inbox first (module docstring).
# Exact (tests/gpu_dense_allreduce_check.py, bit for bit on 2 H100s). Off: 1.74x against 1.74x
# at batch 8192 on 2 H100s (variant "cadam", bench/results/gpu/adam_copy/), and with the chain
# cut too (owner_update.STAGE_BESIDE) +0.3 %, noise (bench/results/gpu/stage_beside/).
ADAM_COPY = False
# (with ADAM_COPY) the copies certified by the padded exchange's second payload barrier instead
# of a barrier of their own (comm/barrier_rider.py): no meeting of the ranks for the dense
# gradients in a step that exchanges after backward. Exact (the same adds as ADAM_COPY;
# tests/gpu_shared_barrier_check.py on 2 H100s). Off: within the calls' noise on 2 H100s at
# batch 8192, 1.746x against 1.740x (2 rounds; ADAM_COPY alone 1.751x) and 1.74x against 1.70x
# (1 round) one GPU (bench/results/gpu/shared_barrier/).
SHARED_BARRIER = False
# (the kernel's vector accesses: the buffer's length rounded up to this many elements)
QUANTUM = 1024


class PeerAllReduce:
    """A flat buffer of ``numel`` ``dtype`` elements in peer memory (:attr:`flat`) and its
    in-place sum over the ranks of ``env`` (collective to construct: every rank alike)."""

    def __init__(
        self, env: DistEnv, numel: int, dtype: torch.dtype, *, in_optimizer: bool = False,
        copied: bool = False,
    ) -> None:  # fmt: skip
        padded = max(QUANTUM, -(-numel // QUANTUM) * QUANTUM)
        w, me = env.world_size, env.rank
        # (copied: an inbox row per rank, this rank's own row unused)
        self.copied = copied and in_optimizer
        layout: dict[str, tuple[tuple[int, ...], torch.dtype]] = {"grads": ((padded,), dtype)}
        if self.copied:
            layout["inbox"] = ((w, padded), dtype)
        self.pm = PeerMemory(env, layout)
        self.padded = self.pm.mine("grads")
        self.flat = self.padded[:numel]
        self.group_name = env.group.group_name if env.group is not None else ""
        # summed by the optimizer (ADAM_PEER): every rank's buffer's address, in rank order
        # (copied: this rank's inbox rows, all local, and its own bucket at its rank)
        self.in_optimizer = in_optimizer
        if self.copied:
            inbox = self.pm.mine("inbox")
            ptrs = [(self.padded if r == me else inbox[r]).data_ptr() for r in range(w)]
            # (where this rank's bucket lands on each peer)
            self._outs = [self.pm.peer("inbox", r)[me, :numel] for r in range(w) if r != me]
        else:
            ptrs = [self.pm.peer("grads", r).data_ptr() for r in range(w)]
            self._outs = []
        self.bases = torch.tensor(ptrs, dtype=torch.int64, device=self.padded.device)

    def barrier(self) -> None:
        """Every rank's writes to its buffer so far visible to every rank (capturable)."""
        self.pm.barrier()

    def ready(self, certified: torch.cuda.Event | None = None) -> None:
        """(Summed by the optimizer) every rank's complete bucket readable by every rank's
        Adam: copied into the peers' inboxes first when :attr:`copied` (after a barrier: every
        peer's last Adam has read its inbox), then the barrier; or, when the exchange's
        barrier ``certified`` the copy (:meth:`copy_out`, ``comm/barrier_rider.py``), a wait
        for that barrier alone."""
        if certified is not None:
            torch.cuda.current_stream(self.flat.device).wait_event(certified)
            return
        if self.copied:
            self.pm.barrier()
        self.copy_out()
        self.pm.barrier()

    def copy_out(self) -> None:
        """(:attr:`copied`) this rank's bucket into its row of every peer's inbox (a
        device-to-device copy: the copy engines, over NVLink)."""
        for out in self._outs:
            out.copy_(self.flat)

    def all_reduce(self) -> None:
        """Every rank's buffer replaced by the sum over ranks (on the current stream;
        capturable in a CUDA graph)."""
        torch.ops.symm_mem.two_shot_all_reduce_(self.padded, "sum", self.group_name)


def peer_all_reduce(
    env: DistEnv, numel: int, dtype: torch.dtype, *, adam: bool = False
) -> tuple[PeerAllReduce | None, str]:
    """(Collective) a :class:`PeerAllReduce` when :data:`DENSE_PEER` (or, for an optimizer
    that can sum them, ``adam``, :data:`ADAM_PEER`) is on and the CUDA ranks of ``env`` share
    peer memory, else None; and how the dense gradients are summed (for the log)."""
    in_opt = ADAM_PEER and adam and dtype == torch.float32
    if not (DENSE_PEER or in_opt) or env.group is None or env.world_size < 2 or numel == 0:
        return None, "the group's all-reduce"
    if env.device.type != "cuda" or env.backend != "nccl":
        return None, "the group's all-reduce (peer memory: CUDA ranks on NCCL)"
    if dtype not in (torch.float32, torch.bfloat16):
        return None, f"the group's all-reduce (peer memory: float32 or bfloat16, not {dtype})"
    copied = in_opt and ADAM_COPY
    how = ("summed by Adam, copied into peer memory (NVLink)" if copied
           else "summed by Adam in peer memory (NVLink)" if in_opt
           else "summed in peer memory (two-shot, NVLink)")  # fmt: skip
    try:
        return PeerAllReduce(env, numel, dtype, in_optimizer=in_opt, copied=copied), how
    except PeerMemoryRefused as e:
        return None, f"the group's all-reduce (no peer memory: {e})"
    except PeerMemoryUnavailable as e:  # (an allocation failed, on every rank alike)
        warnings.warn(f"dense gradients: the group's all-reduce: {e}", stacklevel=2)
        return None, f"the group's all-reduce (no peer memory: {e})"
