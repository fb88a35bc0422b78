"""Buffers every rank of one host allocates and every other rank reads and writes in place:
the transport of the exchange over peer memory planned in ``docs/scaling_plan.md`` (issue 30).

Why: on the 2-GPU step the exchange's chain after backward (pack, two NCCL all-to-alls, answer,
finish) costs ~170 us that one GPU does not spend; on 2 H100s our row kernels gather from and
atomically add into a peer's memory at local speed, and a device barrier costs 5 us inside a
CUDA graph (``bench/results/gpu/p2p_probe/``). With the peers' rows mapped, a reader can gather
a remote row itself and a pusher write its gradient at the owner, with a barrier between the
phases instead of packing and all-to-alls.

Two backends, one contract (:class:`PeerMemory`):

* CUDA: ``torch.distributed._symmetric_memory`` (an allocation every rank of the NCCL group
  makes, mapped into every other rank's address space over NVLink); the barrier is its device
  barrier, so it can be captured in a CUDA graph.
* CPU: a POSIX shared-memory file per rank (``/dev/shm``), mapped by every rank; the barrier is
  the group's (gloo). The files are unlinked once every rank has mapped them: nothing is left
  behind, even by a job that dies later. CPU ranks run the same algorithms as GPUs with it, so
  tests check them with real processes.

A buffer is a flat byte allocation per rank, carved into named, typed views (256-byte aligned).
Only ranks of one host take part (:func:`why_not` says why not otherwise).
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
from typing import Any

import torch
import torch.distributed as dist

from hetgmp.comm.env import DistEnv

ALIGN = 256
Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]
# CUDA allocations of dropped PeerMemory objects, kept while a CUDA graph was being captured:
# freeing symmetric memory then aborts the process ("operation not permitted when stream is
# capturing", 2 H100s, 2026-11-27: a trainer's exchange collected by Python's cycle collector
# while the next one captured). Released by the next PeerMemory made (never during a capture).
_retired: list[Any] = []


def _host_key() -> int:
    """This host's name as a 56-bit number (compared across ranks without pickling)."""
    return int.from_bytes(hashlib.sha256(socket.gethostname().encode()).digest()[:7], "little")


def _gathered(env: DistEnv, value: int) -> list[int]:
    """Every rank's ``value`` (int64), in rank order, through one all-reduce."""
    t = torch.zeros(env.world_size, dtype=torch.int64, device=env.device)
    t[env.rank] = value
    dist.all_reduce(t, group=env.group)
    return [int(v) for v in t.tolist()]


def why_not(env: DistEnv) -> str | None:
    """(Collective) None when the ranks of ``env`` can share peer memory, else why not: a
    single process, a backend other than gloo (CPU) or NCCL (CUDA), ranks on several hosts, or
    CUDA devices without peer access to each other."""
    if env.group is None or env.world_size < 2:
        return "a single process"
    if (env.device.type, env.backend) not in (("cpu", "gloo"), ("cuda", "nccl")):
        return (
            f"backend {env.backend} on {env.device.type} (peer memory: gloo on CPU, NCCL on CUDA)"
        )
    hosts = _gathered(env, _host_key())
    if len(set(hosts)) > 1:
        return f"ranks on {len(set(hosts))} hosts (peer memory is one host's)"
    if env.device.type == "cuda":
        return _cuda_why_not(env)
    return None


def _cuda_why_not(env: DistEnv) -> str | None:
    """(Collective) why the CUDA devices of ``env``'s ranks cannot map each other's memory."""
    index = env.device.index if env.device.index is not None else torch.cuda.current_device()
    devs = _gathered(env, index)
    uuid = str(torch.cuda.get_device_properties(index).uuid).encode()
    gpus = _gathered(env, int.from_bytes(hashlib.sha256(uuid).digest()[:7], "little"))
    seen: dict[int, int] = {}
    for d, g in zip(devs, gpus, strict=True):
        if seen.setdefault(d, g) != g:  # (one index, two GPUs: each rank sees its own only)
            return (f"the ranks see different GPUs as cuda:{d} (a CUDA_VISIBLE_DEVICES per "
                    "rank): peer access cannot be checked")  # fmt: skip
    me = devs[env.rank]
    bad = [d for d in devs if d != me and not torch.cuda.can_device_access_peer(me, d)]
    if bad:
        return f"cuda:{me} has no peer access to cuda:{bad[0]}"
    return None


class PeerMemoryUnavailable(RuntimeError):
    """Raised on every rank alike when the ranks cannot share peer memory or some rank cannot
    allocate its part."""


class PeerMemoryRefused(PeerMemoryUnavailable):
    """The ranks cannot share peer memory at all (:func:`why_not`: no allocation tried)."""


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _offsets(layout: Layout) -> tuple[dict[str, int], int]:
    """Each buffer's byte offset (aligned) and the total bytes."""
    off, total = {}, 0
    for name, (shape, dtype) in layout.items():
        total = -(-total // ALIGN) * ALIGN
        off[name] = total
        n = 1
        for s in shape:
            n *= int(s)
        total += n * torch.empty((), dtype=dtype).element_size()
    return off, max(total, 1)


class PeerMemory:
    """The buffers of ``layout`` (name -> (shape, dtype)) on every rank of ``env``, each rank
    seeing every other's (collective: every rank constructs it with the same layout, zeroed).
    :meth:`mine` and :meth:`peer` are typed views; :meth:`barrier`: every rank's writes before
    it (to any rank's buffers) are visible to every rank after it."""

    def __init__(self, env: DistEnv, layout: Layout) -> None:
        why = why_not(env)
        if why is not None:  # (on every rank alike: why_not is collective)
            raise PeerMemoryRefused(f"peer memory needs the ranks of one host: {why}")
        self.env, self.layout = env, dict(layout)
        self._off, self.nbytes = _offsets(self.layout)
        self._symm: Any = None
        self._flat: list[torch.Tensor] = []
        self.paths: list[str] = []  # (CPU ranks: the shared-memory files, unlinked once mapped)
        if not _capturing():
            _retired.clear()
        if env.device.type == "cuda":
            self._flat = self._cuda_buffers()
        else:
            self._flat = self._shm_buffers()

    def _cuda_buffers(self) -> list[torch.Tensor]:
        import torch.distributed._symmetric_memory as symm_mem

        try:  # (every rank learns whether every rank could allocate before the rendezvous,
            # which would otherwise wait forever for a rank that failed)
            buf: torch.Tensor | None = symm_mem.empty(
                self.nbytes, dtype=torch.uint8, device=self.env.device
            )
            why = ""
        except (RuntimeError, ValueError) as e:
            buf, why = None, f"{type(e).__name__}: {e}"
        self._agree(buf is not None, why, "symmetric memory could not be allocated")
        assert buf is not None
        buf.zero_()
        self._symm = symm_mem.rendezvous(buf, self.env.group)
        get = self._symm.get_buffer
        return [buf if r == self.env.rank else get(r, (self.nbytes,), torch.uint8)
                for r in range(self.env.world_size)]  # fmt: skip

    def _shm_buffers(self) -> list[torch.Tensor]:
        env = self.env
        tag = _gathered(env, int.from_bytes(os.urandom(7), "little") if env.rank == 0 else 0)[0]
        base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        path = [os.path.join(base, f"hetgmp-peer-{tag:x}-{r}") for r in range(env.world_size)]
        self.paths = path  # (gone once mapped: the tests check)
        try:  # (/dev/shm is small in containers: every rank learns of a rank that failed)
            mine: torch.Tensor | None = torch.from_file(
                path[env.rank], shared=True, size=self.nbytes, dtype=torch.uint8
            )
            why = ""
        except (RuntimeError, OSError) as e:
            mine, why = None, f"{type(e).__name__}: {e}"
        try:
            self._agree(mine is not None, why, "shared-memory files could not be made")
        except PeerMemoryUnavailable:
            if mine is not None:  # (nothing left behind)
                os.unlink(path[env.rank])
            raise
        assert mine is not None
        mine.zero_()
        dist.barrier(group=env.group)  # (every file made)
        flat = [mine if r == env.rank else
                torch.from_file(p, shared=True, size=self.nbytes, dtype=torch.uint8)
                for r, p in enumerate(path)]  # fmt: skip
        dist.barrier(group=env.group)  # (every file mapped everywhere: the names can go)
        os.unlink(path[env.rank])
        return flat

    def _agree(self, ok: bool, why: str, what: str) -> None:
        """(Collective) raise :class:`PeerMemoryUnavailable` on every rank if some rank's
        allocation failed (``ok`` False here, ``why`` its error)."""
        failed = _gathered(self.env, int(not ok))
        if any(failed):
            ranks = [r for r, f in enumerate(failed) if f]
            raise PeerMemoryUnavailable(f"{what} on rank(s) {ranks}" + (f" ({why})" if why else ""))

    def __del__(self) -> None:
        # (the allocations outlive a capture in progress: see _retired)
        if getattr(self, "_symm", None) is not None and _capturing():
            _retired.append((self._flat, self._symm))

    def view(self, name: str, rank: int) -> torch.Tensor:
        """Buffer ``name`` of ``rank`` (this rank's or a peer's), typed and shaped."""
        shape, dtype = self.layout[name]
        size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        raw = self._flat[rank][self._off[name] : self._off[name] + size]
        return raw.view(dtype).view(shape)

    def mine(self, name: str) -> torch.Tensor:
        return self.view(name, self.env.rank)

    def peer(self, name: str, rank: int) -> torch.Tensor:
        return self.view(name, rank)

    def barrier(self, channel: int = 0) -> None:
        """Every rank's writes so far, to any rank's buffers, visible to every rank after it
        (CUDA: the device barrier, on the current stream, capturable once a barrier ran
        eagerly; CPU: the group's barrier)."""
        if self._symm is not None:
            self._symm.barrier(channel=channel)
        else:
            dist.barrier(group=self.env.group)
