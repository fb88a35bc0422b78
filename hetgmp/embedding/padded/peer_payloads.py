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

With the fused (Triton) segments the payloads are not copied at all: pack and answer write each
entry straight into the peer's receive row (:mod:`.payload_triton`, given the table of the
peers' row addresses, :attr:`PeerPayloads.rows1` / ``rows2``), and the exchange is the barrier.
On 2 H100s the copies lost to NCCL (1.54x against 1.59x, ``bench/results/gpu/peer_direct/``);
kernels reach a peer's memory at local speed (``p2p_probe/``).

Switched by :data:`PEER_PAYLOADS` (on for CUDA ranks: ``read_ahead_ab.sh`` variant ``peer``
against ``early``); where the ranks cannot share peer memory the NCCL all-to-alls stay. Gloo
ranks take it only with :data:`ON_CPU` (the tests: ``/dev/shm`` is small in containers, and on
CPU the all-to-alls cost little).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from hetgmp.comm.barrier_rider import BarrierRider
from hetgmp.comm.env import DistEnv
from hetgmp.comm.peer_memory import PeerMemory, PeerMemoryRefused, PeerMemoryUnavailable

# On since 2026-11-27: 2x H200, the user's command at batch 8192, 1.60x -> 1.65x one GPU's
# samples/s (bench/results/gpu/peer_direct/); tests/gpu_whole_step_check.py passed with it.
PEER_PAYLOADS = True
ON_CPU = False
# The replies pulled instead of pushed (direct payloads only): answer writes them into its own
# send buffer in peer memory and the querier's finish reads its row there, after the barrier.
# Why: answer_queries took 20 us with its row writes crossing NVLink, 10 with local writes
# (bench/results/gpu/scaling_diagnosis/timeline_8192_peer/), and remote reads ran at local
# speed in p2p_probe/. Exact (tests/test_peer_payloads.py; tests/gpu_whole_step_check.py
# passed with it on 2 H100s). On since measured twice on 2 H100s at batch 8192: 1.67x ->
# 1.70x and 1.66x -> 1.68x one GPU (bench/results/gpu/chain_switches/, dense_allreduce/).
PULL_REPLIES = True


class PeerPayloads:
    """``recv1 [w, s1]`` and ``recv2 [w, s2]`` (float32) in peer memory, and the transport
    that replaces the all-to-alls into them (collective to construct). ``direct``: the
    segments write into the peers' rows themselves (the fused kernels); else the send buffers
    are copied there."""

    def __init__(
        self, comm: DistEnv, s1: int, s2: int, *, direct: bool = False, pull: bool = False
    ) -> None:
        w = comm.world_size
        f32 = torch.float32
        self.rank, self.world, self.direct = comm.rank, w, direct
        self.pull = pull and direct  # (replies pulled: .PULL_REPLIES)
        reply = "send2" if self.pull else "recv2"
        self.pm = PeerMemory(comm, {"recv1": ((w, s1), f32), reply: ((w, s2), f32)})
        self.recv1 = self.pm.mine("recv1")
        # where this rank's row lives in each peer's receive buffers (row ``rank`` of peer j's);
        # pulled replies: this rank's own send buffer, and its row in each peer's
        self.rows1, self.rows2 = (self._row_table(name) for name in ("recv1", reply))
        self.recv2 = self.send2 = self.pm.mine(reply)

    def _row_table(self, name: str) -> torch.Tensor:
        ptrs = [self.pm.peer(name, j)[self.rank].data_ptr() for j in range(self.world)]
        if any(a % 16 for a in ptrs):  # (the kernels' vector stores assume it)
            raise RuntimeError(f"peer payload rows not 16-byte aligned: {ptrs}")
        return torch.tensor(ptrs, dtype=torch.int64, device=self.recv1.device)

    def exchange(self, send: torch.Tensor, name: str, rider: BarrierRider | None = None) -> None:
        """Row ``j`` of ``send`` into row ``rank`` of rank ``j``'s buffer ``name`` (unless the
        segment wrote there directly), then the barrier (its own channel per buffer: a
        captured step replays both); ``rider``: another stream's work around the barriers."""
        if not self.direct:
            for j in range(self.world):
                self.pm.peer(name, j)[self.rank].copy_(send[j], non_blocking=True)
        first = name == "recv1"
        if rider is not None and not first:
            rider.before_second()
        self.pm.barrier(channel=0 if first else 1)
        if rider is not None:
            rider.after_first() if first else rider.after_second()

    def barrier_early(self) -> None:
        """The barrier after the counts phase wrote the pushes' ids into the peers' rows
        (``owner_update.PUSH_SLOTS_EARLY``; a channel of its own)."""
        self.pm.barrier(channel=2)


def peer_payloads(
    comm: DistEnv, s1: int, s2: int, *, direct: bool, old: Any = None
) -> tuple[PeerPayloads | None, str]:
    """(Collective) the peer-memory transport for payloads of ``s1`` / ``s2`` floats per peer,
    when :data:`PEER_PAYLOADS` is on and the ranks of ``comm`` can share peer memory, else
    None (the NCCL all-to-alls); and what the log says of it. ``direct``: the fused segments
    write into the peers' rows. ``old``: the buffers a rebuild replaces, whose transport is
    kept (not collective) where the payloads' sizes hold: a rebuild for this rank's own
    capacities (its distinct or own rows) may be this rank's alone, and its peers would not
    meet it in a new rendezvous (a hang)."""
    if old is not None and (old.s1, old.s2, old.fused) == (s1, s2, direct):
        return old.peer, old.payload_note
    if not PEER_PAYLOADS or comm.group is None or comm.world_size < 2:
        return None, "all-to-alls"
    if comm.device.type != "cuda" and not ON_CPU:
        return None, "all-to-alls"
    try:
        peer = PeerPayloads(comm, s1, s2, direct=direct, pull=PULL_REPLIES)
    except PeerMemoryRefused as e:  # (no peer memory here: the all-to-alls, as expected)
        return None, f"all-to-alls (no peer memory: {e})"
    except PeerMemoryUnavailable as e:  # (an allocation failed, on every rank alike)
        warnings.warn(f"padded exchange: the payloads take NCCL's all-to-alls: {e}", stacklevel=2)
        return None, f"all-to-alls (no peer memory: {e})"
    how = "written by the exchange's kernels" if direct else "copied"
    pulled = ", the replies read from the owners'" if peer.pull else ""
    return peer, f"{how} into the peers' memory{pulled}, a device barrier per exchange"


def payload_target(st: Any, which: int) -> tuple[torch.Tensor, bool]:
    """What a fused segment writes payload ``which`` (1: pack's, 2: answer's) into: the peers'
    row table (and True) when it writes there directly, else the send buffer (and False)."""
    peer = st.peer
    if peer is not None and peer.direct and not (which == 2 and peer.pull):
        return (peer.rows1 if which == 1 else peer.rows2), True
    return (st.send1 if which == 1 else st.send2), False


def reply_source(st: Any) -> tuple[torch.Tensor, bool]:
    """Where finish reads the replies: the table of this rank's rows in the owners' send
    buffers (and True) when they are pulled, else the receive buffer (and False)."""
    peer = st.peer
    if peer is not None and peer.pull:
        return peer.rows2, True
    return st.recv2, False
