"""Work stealing for the unequal-steps loop of ``--sync async`` (:mod:`hetgmp.train.async_loop`):
every epoch trains each sample once, however unequal the ranks' speeds.

Why. Under the global sample budget alone each rank cycles its own shard, so a rank twice as
slow has its shard trained half as often as the others': its samples are under-trained and its
owned rows get fewer updates (AUC -0.0023 against bound 0 with a 2x straggler on 4 CPU ranks,
``bench/results/async_cpu.md``). With stealing, a rank that has taken every batch of its own
shard for epoch ``e`` takes the unclaimed batches of the slower ranks' shards for ``e``, and
moves to epoch ``e + 1`` only when no batch of ``e`` is left anywhere.

How. Each rank's batches of an epoch are the :class:`~hetgmp.data.loader.BatchLoader` order of
its shard (every rank can compute every rank's: the plan and the seed say it). The owner takes
them from the head, in order; a peer *claims* one from the tail through the owner's service (a
``claim`` request, answered under the :class:`ShardQueue` lock that the owner's takes share), so
no batch is trained twice nor lost. A thief asks the ranks with the fewest samples taken first,
builds the claimed batch from the data set on the host, and trains it like its own: rows it does
not store come through their owners' services, as for any batch. Claims run ahead of a lagging
owner too (the tail of a later epoch, kept until the owner gets there).

What it leaves as it was: the stop rule (the global sample budget), the per-row ``--bound`` and
the per-clock ``--max-lag`` (a stolen step is a step: it advances the thief's clock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hetgmp.comm.collectives import all_gather_object
from hetgmp.comm.rpc.schema import Array, BadMessage, Field, Schema
from hetgmp.data.device_batches import DeviceBatch, Slot, host_to_device
from hetgmp.data.loader import BatchLoader, gather

if TYPE_CHECKING:
    from hetgmp.comm.env import DistEnv
    from hetgmp.data.device_batches import EpochPlan
    from hetgmp.embedding.rowservice import AsyncStep

# work stealing's operation on a rank's RPC service (hetgmp.comm.rpc): {"epoch": e} -> {"batch": [b]}
# (b = -1: none left)
CLAIM = b"claim"
MAX_EPOCH = 2**40


# a claim's answer: the batch's position, -1 if none is left (hetgmp.comm.rpc.schema)
def _one_batch(meta: dict[str, Any], a: dict[str, np.ndarray]) -> None:
    if a["batch"].shape != (1,):
        raise BadMessage(f"a claim's answer of {a['batch'].shape[0]} batches, not 1")


CLAIMED = Schema({}, {"batch": Array("int64", max_len=1, lo=-1, hi=MAX_EPOCH)}, _one_batch)


class ShardQueue:
    """This rank's batches of each epoch: the owner takes them from the head (:meth:`own`),
    peers claim them from the tail (:meth:`claim`, the service thread), under one lock."""

    def __init__(self, batches: int) -> None:
        self.batches = batches
        self.epoch, self.head = 0, 0
        self.tails: dict[int, int] = {}  # epoch -> end of its unclaimed batches (default: all)
        self.claimed = 0  # batches peers took from this rank
        self._lock = threading.Lock()

    def own(self, epoch: int, batch: int) -> bool:
        """The owner is about to train ``batch`` of ``epoch`` (batches come in order): True if
        it is still the owner's, False if a peer claimed it (and every later one of the epoch)."""
        with self._lock:
            if epoch != self.epoch:
                self.epoch, self.head = epoch, 0
                self.tails = {e: t for e, t in self.tails.items() if e >= epoch}
            if batch < self.tails.get(epoch, self.batches):
                self.head = batch + 1
                return True
            return False

    def claim(self, epoch: int) -> int:
        """A peer takes the last unclaimed batch of ``epoch``: its position, or -1."""
        with self._lock:
            if epoch < self.epoch:
                return -1  # (the owner moved on: every batch of that epoch was taken)
            tail = self.tails.get(epoch, self.batches)
            head = self.head if epoch == self.epoch else 0
            if tail <= head:
                return -1
            self.tails[epoch] = tail - 1
            self.claimed += 1
            return tail - 1


class Stealer:
    """This rank's side of work stealing: it answers claims on its own :class:`ShardQueue`
    (registered with its service) and claims and builds the batches of its peers."""

    def __init__(
        self,
        engine: AsyncStep,
        plan: EpochPlan,
        indices_of: Callable[[int], np.ndarray],
        device: torch.device,
    ) -> None:
        self.engine, self.plan, self.indices_of, self.device = engine, plan, indices_of, device
        self.rank = engine.env.rank
        self.world = engine.env.world_size
        self.queue = ShardQueue(plan.local_batches)
        self.stolen = 0  # batches this rank took from peers
        self.trained: list[tuple[int, int, int]] = []  # (owner, epoch, batch) of each step
        self._loaders: dict[tuple[int, int], BatchLoader] = {}
        # (before the loop's barrier: see AsyncLoop)
        engine.rpc.register(CLAIM, self._serve, Schema({"epoch": Field(hi=MAX_EPOCH)}))

    def _serve(self, meta: dict[str, Any], arrays: dict[str, torch.Tensor]) -> dict[str, Any]:
        b = self.queue.claim(int(meta["epoch"]))
        # A host tensor whatever the store's device: replies go out as host frames (hetgmp.comm.rpc.wire.pack)
        return {"batch": torch.tensor([b], dtype=torch.int64)}

    def steal(self, epoch: int) -> tuple[Slot, DeviceBatch] | None:
        """Claim a batch of ``epoch`` from the slowest peer that has one left (fewest samples
        taken first) and build it; None when no peer has any."""
        t0 = time.perf_counter()
        try:
            return self._steal(epoch)
        finally:
            self.engine.phase_s["steal"] += time.perf_counter() - t0

    def _steal(self, epoch: int) -> tuple[Slot, DeviceBatch] | None:
        samples = self.engine.peer_samples
        peers = sorted((p for p in range(self.world) if p != self.rank), key=lambda p: samples[p])
        for p in peers:
            ans = self.engine.peers.request_all(
                {p: (CLAIM, {"epoch": epoch}, {})}, "work steal", lambda p: CLAIMED
            )
            b = int(ans[p]["batch"][0])
            if b >= 0:
                self.stolen += 1
                self.trained.append((p, epoch, b))
                return Slot(-1, epoch, b, False), self._batch(p, epoch, b)
        return None

    def _batch(self, owner: int, epoch: int, b: int) -> DeviceBatch:
        key = (owner, epoch)
        if key not in self._loaders:
            self._loaders = {k: v for k, v in self._loaders.items() if k[1] >= epoch}
            p = self.plan
            self._loaders[key] = BatchLoader(
                p.split, p.batch_size, indices=self.indices_of(owner), shuffle=p.shuffle,
                seed=p.seed, epoch=epoch,
            )  # fmt: skip
        loader = self._loaders[key]
        return host_to_device(gather(loader.split, loader.batch_indices(b)), self.device)

    def took_own(self, slot: Slot) -> None:
        self.trained.append((self.rank, slot.epoch, slot.batch))

    def stats(self) -> dict[str, int]:
        return {"stolen": self.stolen, "claimed_from": self.queue.claimed}


def epoch_coverage(env: DistEnv, trained: list[tuple[int, int, int]], batches: list[int]) -> dict:
    """(Collective) how the ranks' steps covered each epoch they touched: per epoch, the
    batches of all shards trained by nobody (``missing``; the last epoch is cut by the budget)
    and trained more than once (``repeated``: 0 with work stealing). ``batches``: each rank's
    batches per epoch."""
    rows = all_gather_object(env, np.asarray(trained, dtype=np.int64).reshape(-1, 3))
    steps = np.concatenate(rows)
    out: dict[str, list[int]] = {"epochs": [], "missing": [], "repeated": []}
    starts = np.concatenate([[0], np.cumsum(batches)])
    for e in sorted({int(x) for x in steps[:, 1]}):
        at = steps[steps[:, 1] == e]
        counts = np.bincount(starts[at[:, 0]] + at[:, 2], minlength=int(starts[-1]))
        out["epochs"].append(e)
        out["missing"].append(int((counts == 0).sum()))
        out["repeated"].append(int(np.clip(counts - 1, 0, None).sum()))
    return out
