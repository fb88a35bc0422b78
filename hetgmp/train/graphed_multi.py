"""The whole training step of a rank of several, replayed as one CUDA graph.

Why: with several ranks the step was the dense part's graph plus the exchange's graphs with a
host wait for each step's sizes and eager work between them; on 2 H200s the user's command ran
at 0.41x of one GPU (batch 8192, 2026-11-26). Here, as with one rank (:mod:`.graphed`), one
replay holds everything: the batch's gather from the resident samples, its preparation, the
exchange (its NCCL all-to-alls captured on the exchange's own communicator), the owners'
updates and answers, the model's forward and backward, the gradient summed per row, the dense
gradients' all-reduce (on that communicator too) and the dense optimizer. The host copies the
batch's positions and replays; it never waits for the device.

What makes that possible is the embedding's side (:mod:`hetgmp.embedding.padded.whole`):
capacities fixed per epoch from the epoch's own batches (the verdict of each step,
:attr:`~hetgmp.data.device_batches.PendingBatch.fits`), and a step whose state lives in fixed
buffers only. Two graphs alternate, one per preparation ring slot (a step reads the last
batch's preparation from the other slot).

Eager steps, with the same arithmetic: the warm-up, profiled steps, batches that are not full on
every rank (the global batch size says so, the same on every rank), batches over the capacity
cap, and the first step after one that did not leave the padded state (an evaluation, a
flush). On CPU (tests) a "replay" runs the captured flow plainly, so the graph path's logic
(no host reads, fixed buffers) is exercised without CUDA.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from hetgmp.comm.env import DistEnv
from hetgmp.data.device_batches import DeviceBatch, PendingBatch, ResidentSource
from hetgmp.embedding import engine_of
from hetgmp.embedding.engine import GraphReleaser, PendingGrads, WholeStep
from hetgmp.train.graphed import GRAPH_DENSE_OPTIMIZERS
from hetgmp.train.graphed_head import WARMUP_STEPS
from hetgmp.train.profile import NoMarks, PhaseProfiler, ReplayTimer
from hetgmp.train.step import TrainStep


def multi_graph_support(step: TrainStep, cfg: Any) -> str | None:
    """None when a rank of several can replay its whole step as one CUDA graph, else why not
    (for the log; the data source is checked when it opens)."""
    env, emb = step.env, step.model.embedding
    if not cfg.cuda_graphs:
        return "--no-cuda-graphs"
    if env.device.type != "cuda":
        return f"device {env.device.type}"
    if cfg.dense_optimizer not in GRAPH_DENSE_OPTIMIZERS:
        return f"--dense-optimizer {cfg.dense_optimizer}: torch cannot capture it"
    if cfg.dense_sync_every != 1:
        return "--dense-sync-every != 1"
    engine = engine_of(emb)
    if engine is None or engine.kind != "collective" or emb.exchange != "padded":
        return "several ranks need the padded exchange (--exchange, --replies, --sync)"
    return None


@dataclasses.dataclass(eq=False)
class _Entry:
    """One captured step (per ring slot): how to run it, its inputs and outputs."""

    run: Callable[[], torch.Tensor]
    pos: torch.Tensor
    source: ResidentSource
    grads: PendingGrads
    graph: object = None  # (the CUDA graph: held for as long as the entry)


class MultiRankGraphedStep:
    """``TrainStep``'s call for a rank of several, replayed as one CUDA graph where it can
    (module docstring). ``comm``: the env of the exchange's own communicator (captured
    collectives must not share one with eager calls); ``batch_size``: the full batch;
    ``time_replays``: that many replays are timed with events (``timer``, a :class:`~.profile.ReplayTimer`)."""

    def __init__(
        self, step: TrainStep, whole: WholeStep, comm: DistEnv, *, batch_size: int,
        warmup: int = WARMUP_STEPS, time_replays: int = 0,
    ) -> None:  # fmt: skip
        self.step, self.whole, self.comm = step, whole, comm
        self.env = step.env
        self.batch_size, self.warmup = batch_size, warmup
        self.graphed = step.env.device.type == "cuda"
        if self.graphed:
            GraphReleaser.register(step.env, self)
        self._entries: dict[int, _Entry] = {}
        self._generation: object = None
        self.replays = 0
        self.eager_steps = 0
        self.timer = ReplayTimer(time_replays)

    def __call__(
        self,
        batch: DeviceBatch | PendingBatch,
        global_batch: int,
        marks: NoMarks | PhaseProfiler | None = None,
    ) -> torch.Tensor:
        """Train on ``batch``; returns float32 ``[loss sum, correct]`` on the device, valid
        until the next call (a replay rewrites it)."""
        slot = self._slot(batch, global_batch, marks)
        if slot is None:
            self.eager_steps += 1
            b = batch.gather() if isinstance(batch, PendingBatch) else batch
            return self.step(b, global_batch, marks)
        assert isinstance(batch, PendingBatch)
        if self.whole.generation is not self._generation:  # (buffers rebuilt: graphs stale)
            self._drop()
            self._generation = self.whole.generation
        entry, out = self._entries.get(slot), None
        if entry is None or entry.source is not batch.source:
            entry, out = self._capture(batch, global_batch)  # (out: CPU, the step ran)
            self._entries[slot] = entry
        if out is None:
            entry.pos.copy_(batch.pos, non_blocking=True)
            out = self._replay(entry)
        self.whole.after_replay(self._shape(batch), slot, entry.grads)
        self.replays += 1
        return out

    def _shape(self, batch: PendingBatch) -> tuple[int, int]:
        return (len(batch), int(batch.source.sparse.shape[1]))

    def _slot(
        self, batch: DeviceBatch | PendingBatch, global_batch: int,
        marks: NoMarks | PhaseProfiler | None,
    ) -> int | None:  # fmt: skip
        """The ring slot to replay for this step, or None for an eager step."""
        full = (
            isinstance(batch, PendingBatch) and len(batch) == self.batch_size
            and global_batch == self.batch_size * self.env.world_size
        )  # fmt: skip
        if not full:
            return None
        assert isinstance(batch, PendingBatch)
        profiled = isinstance(marks, PhaseProfiler) and marks.active
        if self.warmup > 0 or profiled or not batch.fits:
            self.warmup -= 1
            return None
        return self.whole.ready(self._shape(batch))

    def _replay(self, entry: _Entry) -> torch.Tensor:
        return self.timer.replay(entry.run, timed=self.replays > 0 and self.graphed)

    def _capture(
        self, batch: PendingBatch, global_batch: int
    ) -> tuple[_Entry, torch.Tensor | None]:
        """Record one step on a fixed positions buffer (recording runs nothing on CUDA: the
        caller then replays it for this batch). On CPU the "graph" is the same flow run
        plainly, now (its result is returned) and at each replay."""
        source, pos = batch.source, batch.pos.clone()

        def flow() -> torch.Tensor:
            bucket = self.step.bucket
            env, bucket.env = bucket.env, self.comm  # (the dense all-reduce: see the class)
            try:
                with self.whole.capturing():
                    return self.step(source.gather(pos), global_batch)
            finally:
                bucket.env = env

        if not self.graphed:
            out = flow()
            return _Entry(flow, pos, source, self.whole.pending()), out
        torch.cuda.synchronize(self.env.device)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (NCCL's watchdog, a data prefetcher) may use CUDA
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = flow()
        grads = self.whole.pending()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return _Entry(replay, pos, source, grads, graph), None

    def release_graphs(self) -> None:
        """Drop the captured graphs (they hold the exchange's communicator: before it goes,
        :func:`hetgmp.comm.launch.shutdown` calls this through ``env.closers``)."""
        self._drop()

    def _drop(self) -> None:
        """Forget the captured graphs (after the device is done with them)."""
        if self._entries and self.graphed:
            torch.cuda.synchronize(self.env.device)
        self._entries.clear()
