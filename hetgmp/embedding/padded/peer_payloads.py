"""The padded exchange's two payload all-to-alls over peer memory (issue 30,
``docs/scaling_plan.md``): each rank copies its payload for peer ``j`` straight into ``j``'s
receive buffer (which lives in :class:`hetgmp.comm.peer_memory.PeerMemory`), then a barrier;
no NCCL kernels, the payload layouts unchanged.

Why: the two NCCL all-to-alls cost ~26 us each on the 2-GPU step's chain at batch 8192 (a
kernel timeline, ``bench/results/gpu/scaling_diagnosis/timeline_8192/``); a copy over NVLink
and a device barrier (~5 us in a CUDA graph) should cost less. The first piece of the exchange
over peer memory; the later ones read and add rows in the peers' buffers directly.

Order (why one barrier per exchange is enough): a rank writes a peer's ``recv1`` again only
after passing the current step's second barrier, which that peer reaches only once its answer
has read ``recv1`` (stream order); and a peer's ``recv2`` again only after the next step's
first barrier, which the peer reaches only once its finish has read ``recv2``.

Switched on by :data:`PEER_PAYLOADS` (off until measured on GPUs: ``read_ahead_ab.sh``
variant ``peer``); where the ranks cannot share peer memory the NCCL all-to-alls stay.
"""

from __future__ import annotations

import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.peer_memory import PeerMemory, why_not

PEER_PAYLOADS = False


class PeerPayloads:
    """``recv1 [w, s1]`` and ``recv2 [w, s2]`` (float32) in peer memory, and the copies that
    replace the all-to-alls into them (collective to construct)."""

    def __init__(self, comm: DistEnv, s1: int, s2: int) -> None:
        w = comm.world_size
        f32 = torch.float32
        self.rank, self.world = comm.rank, w
        self.pm = PeerMemory(comm, {"recv1": ((w, s1), f32), "recv2": ((w, s2), f32)})
        self.recv1, self.recv2 = self.pm.mine("recv1"), self.pm.mine("recv2")

    def exchange(self, send: torch.Tensor, name: str) -> None:
        """Row ``j`` of ``send`` into row ``rank`` of rank ``j``'s buffer ``name``, then the
        barrier (its own channel per buffer: a captured step replays both)."""
        for j in range(self.world):
            self.pm.peer(name, j)[self.rank].copy_(send[j], non_blocking=True)
        self.pm.barrier(channel=0 if name == "recv1" else 1)


def peer_payloads(comm: DistEnv, s1: int, s2: int) -> PeerPayloads | None:
    """(Collective) the peer-memory transport for payloads of ``s1`` / ``s2`` floats per peer,
    when :data:`PEER_PAYLOADS` is on and the ranks of ``comm`` can share peer memory; else
    None (the NCCL all-to-alls)."""
    if not PEER_PAYLOADS or comm.group is None or comm.world_size < 2:
        return None
    if why_not(comm) is not None:
        return None
    return PeerPayloads(comm, s1, s2)
