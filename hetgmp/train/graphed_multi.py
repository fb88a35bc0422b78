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
buffers only. The graphs rotate over the preparation ring slots (a step reads the last
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

import torch

from hetgmp.comm.env import DistEnv, purpose_env
from hetgmp.data.device_batches import DeviceBatch, PendingBatch, ResidentSource
from hetgmp.embedding.engine import GraphReleaser, PendingGrads, WholeStep
from hetgmp.embedding.padded import ahead as read_ahead
from hetgmp.embedding.padded import streams
from hetgmp.embedding.padded.ahead import Primed
from hetgmp.embedding.padded.fields import SLOTS
from hetgmp.embedding.tier_windows import EpochWindows
from hetgmp.train.graphed_head import WARMUP_STEPS
from hetgmp.train.graphed_multi_prime import exact_ids, key_of, next_batch, primed_for
from hetgmp.train.inputs_ahead import InputsAhead, exact_primed
from hetgmp.train.multi_hot import bag_verdicts
from hetgmp.train.profile import NoMarks, PhaseProfiler, ReplayTimer
from hetgmp.train.step import TrainStep


@dataclasses.dataclass(eq=False)
class _Entry:
    """One captured step (per ring slot): how to run it, its inputs and outputs."""

    run: Callable[[], torch.Tensor]
    pos: torch.Tensor
    source: ResidentSource
    grads: PendingGrads | None  # (None: an early exchange pushed it)
    graph: object = None  # (the CUDA graph: held for as long as the entry)
    # reading one step ahead (hetgmp.embedding.padded.ahead): the next batch's positions and
    # the exchange the step leaves primed for it
    pos_next: torch.Tensor | None = None
    primed: Primed | None = None


class MultiRankGraphedStep:
    """``TrainStep``'s call for a rank of several, replayed as one CUDA graph where it can
    (module docstring). ``comm``: the env of the exchange's own communicator (captured
    collectives must not share one with eager calls); ``batch_size``: the full batch;
    ``time_replays``: that many replays are timed with events (``timer``, a :class:`~.profile.ReplayTimer`)."""

    def __init__(
        self, step: TrainStep, whole: WholeStep, comm: DistEnv, *, batch_size: int,
        warmup: int = WARMUP_STEPS, time_replays: int = 0, counts: list[int] | None = None,
        steps_per_epoch: int = 0, boundary: Callable[[int], bool] | None = None,
    ) -> None:  # fmt: skip
        self.step, self.whole, self.comm = step, whole, comm
        self.env = step.env
        self.batch_size, self.warmup = batch_size, warmup
        self.graphed = step.env.device.type == "cuda"
        if self.graphed:
            GraphReleaser.register(step.env, self)
        self._entries: dict[tuple[int, bool, bool], _Entry] = {}  # (slot, primes, last)
        self._generation: object = None
        self.replays = 0
        self.eager_steps = 0
        self.timer = ReplayTimer(time_replays)
        # reading one step ahead (where --bound >= 1): the ranks' sample counts say which
        # next batches are full everywhere; the dense all-reduce then runs on a communicator
        # of its own (it overlaps the exchange's collectives on another stream)
        self.ahead = whole.padded.ahead
        self.counts, self.steps_per_epoch = counts, steps_per_epoch
        # whether an evaluation, checkpoint or the run's end follows a global step (counted
        # from 1): the next batch is then left alone (its early exchange would be dropped)
        self.boundary = boundary
        self.reads_ahead = (
            bool(counts) and read_ahead.ENABLED and whole.ctx.bound >= 1
            and batch_size <= read_ahead.AUTO_MAX_BATCH
        )  # fmt: skip
        # multi-hot bags (their fixed-shape lookup): the table is handed every slot of a
        # sample's [F + W] ids as an [N, 1] batch; the next batch planned from those table ids
        # (.inputs pins the batch's ids to the plan's); no reading ahead
        self.bags = getattr(step.model, "bags", None)
        self.reads_ahead = self.reads_ahead and self.bags is None
        # planning ahead: exact, at any bound (the next batch's plan only)
        self.plans_ahead = bool(counts) and (read_ahead.PLAN_AHEAD or self.reads_ahead)
        # and the next batch's exchange right after backward (exact, at any bound)
        self.early = self.plans_ahead and read_ahead.EXCHANGE_EARLY and not self.reads_ahead
        self.ahead.values, self.ahead.early = self.reads_ahead, self.early
        self.dense_comm = self._dense_comm() if self.reads_ahead or self.early else comm
        # the next batch's dense features and labels, gathered under its early exchange
        self.inputs = InputsAhead(SLOTS, self.bags)
        self._stream: torch.cuda.Stream | None = None  # (the capture stream: _capture)
        self._primed_for: tuple[int, int] | None = None  # (positions' address, epoch)
        self.replays_ahead = 0  # replays of a graph that read its rows one step ahead
        self.replays_planned = 0  # replays of a graph whose plan was made one step ahead
        self.replays_early = 0  # replays that took rows the last step exchanged early
        self.growths = 0  # epoch starts whose capacities grew (buffers rebuilt, graphs again)
        # (--rows-on host: the epoch's owned rows held window by window, the windows asked
        # before each step by the source's slot: the trainer sets epoch_source)
        self.tier_windows: EpochWindows | None = None
        self.epoch_source: ResidentSource | None = None

    def __call__(
        self,
        batch: DeviceBatch | PendingBatch,
        global_batch: int,
        marks: NoMarks | PhaseProfiler | None = None,
    ) -> torch.Tensor:
        """Train on ``batch``; returns float32 ``[loss sum, correct]`` on the device, valid
        until the next call (a replay rewrites it)."""
        if self.tier_windows is not None and self.epoch_source is not None:
            at = self.epoch_source.last_slot  # (every rank's, with or without a batch)
            if at is not None:
                self.tier_windows.before_step(at.batch)
        nxt = next_batch(self, batch, global_batch, marks)
        slot = self._slot(batch, global_batch, marks)
        takes = slot is not None and primed_for(self, batch, slot)  # (what the last step left)
        piped = takes and nxt is not None
        # after an early exchange no gradient is pending: only a graph that takes its rows
        # (and primes the next batch, or not: the last step before an epoch end or boundary)
        early_left = self.whole.stepper.grads is None
        last = self.early and early_left and takes and nxt is None
        if slot is None or (nxt is not None and not piped) or (early_left and not takes):
            return self._eager(batch, global_batch, marks, nxt)
        assert isinstance(batch, PendingBatch)
        if self.whole.generation is not self._generation:  # (buffers rebuilt: graphs stale)
            self._drop()
            self._generation = self.whole.generation
        key = (slot, piped, last)
        entry, out = self._entries.get(key), None
        if entry is None or entry.source is not batch.source:
            entry, out = self._capture(batch, global_batch, nxt, piped or last)
            self._entries[key] = entry
        if out is None:
            entry.pos.copy_(batch.pos, non_blocking=True)
            if nxt is not None and entry.pos_next is not None:
                entry.pos_next.copy_(nxt.pos, non_blocking=True)
            out = self._replay(entry)
        self.whole.after_replay(self._shape(batch), slot, entry.grads)
        self.ahead.primed = entry.primed
        self.ahead.primed_at = self.whole.stepper.count
        self._primed_for = key_of(nxt)
        self.replays += 1
        self.replays_planned += int(piped)
        self.replays_ahead += int(piped and self.reads_ahead)
        self.replays_early += int((piped or last) and self.early)
        return out

    @property
    def note(self) -> str:
        """What the log's step line adds about planning or reading ahead (empty when the
        steps do neither)."""
        if self.reads_ahead:
            return (f"; each reads the next batch's rows one step ahead (--bound >= 1, at most "
                    f"{read_ahead.AUTO_MAX_BATCH} samples per rank; a read may exceed the bound "
                    "by one step)")  # fmt: skip
        if self.early:
            return ("; each plans the next batch while it computes and starts its exchange "
                    "right after backward (exact)")  # fmt: skip
        if self.plans_ahead:
            return "; each plans the next batch while it computes (exact)"
        return ""

    def epoch_check(
        self, sparse: torch.Tensor, positions: torch.Tensor, batch_size: int,
        note: Callable[[str], None],
    ) -> list[bool]:  # fmt: skip
        """(Collective, at an epoch start) each step's verdict (:meth:`WholeStep.epoch_fits`),
        and through ``note`` what :meth:`WholeStep.epoch_notes` says (capacities grown)."""
        old, steps, bags = self.whole.padded.frozen, self.steps_per_epoch, self.bags
        if self.whole.ctx.owned is not None:  # (--rows-on host: the epoch's owned rows held)
            if self.tier_windows is None:
                self.tier_windows = EpochWindows(self.env, self.whole.ctx)
            self.tier_windows.start(sparse, positions, batch_size, steps)
        # (bags: within a compact lookup's capacity, which sets its table ids per batch)
        ok = None
        if bags is not None:
            ok = bag_verdicts(bags, self.env, steps, sparse, positions, batch_size, note)
        n = None if bags is None else bags.table_rows(batch_size)
        fits = self.whole.epoch_fits(sparse, positions, batch_size, steps, n=n)
        fits = fits if ok is None else [a and b for a, b in zip(fits, ok, strict=True)]
        self.growths += int(old is not None and self.whole.padded.frozen != old)
        for line in self.whole.epoch_notes(old):
            note(line)
        return fits

    # ---------------------------------------------------------------- reading one step ahead
    def _eager(
        self, batch: DeviceBatch | PendingBatch, global_batch: int,
        marks: NoMarks | PhaseProfiler | None, nxt: PendingBatch | None,
    ) -> torch.Tensor:  # fmt: skip
        """An eager step; with ``nxt`` it also runs the next batch's exchange (inline), so
        that the next step can replay the graph that reads ahead."""
        self.eager_steps += 1
        b = batch.gather(exact_ids(self, batch)) if isinstance(batch, PendingBatch) else batch
        if nxt is None:
            return self.step(b, global_batch, marks)
        self.ahead.next_ids = lambda: self._table_ids(nxt.source.gather_ids(nxt.pos))
        try:
            out = self.step(b, global_batch, marks, after_backward=self._after_backward(nxt))
            if self.reads_ahead:
                self.whole.apply_stored_now()
            self.inputs.fill_next(exact_primed(self.ahead, self.early), nxt.source, nxt.pos)
        finally:
            self.ahead.next_ids = None
        self._primed_for = key_of(nxt)
        return out

    def _table_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.bags is None else self.bags.flat_ids(ids)

    def _after_backward(self, nxt: PendingBatch | None) -> Callable[[], None] | None:
        """What a step that exchanges the next batch early runs after its backward."""
        return self.whole.exchange_early if self.early and nxt is not None else None

    def _dense_comm(self) -> DistEnv:
        """(Collective) the env of the dense all-reduce in a graph that reads ahead: with NCCL
        a communicator of its own (NCCL must not run two streams' collectives on one)."""
        env = self.comm
        if not self.graphed or env.backend != "nccl" or env.group is None:
            return env
        return purpose_env(env, "dense")

    def _shape(self, batch: PendingBatch) -> tuple[int, int]:
        """The shape of the ids the table is handed for ``batch`` (its preparation ring's)."""
        if self.bags is not None:  # (every padded slot, or compact: BagLayout.table_rows)
            return (self.bags.table_rows(len(batch)), 1)
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
        slot = self.whole.ready(self._shape(batch))
        return (
            slot
            if slot is not None or not self.early
            else self.whole.ready_early(self._shape(batch))
        )

    def _replay(self, entry: _Entry) -> torch.Tensor:
        return self.timer.replay(entry.run, timed=self.replays > 0 and self.graphed)

    def _capture(
        self, batch: PendingBatch, global_batch: int, nxt: PendingBatch | None, takes: bool
    ) -> tuple[_Entry, torch.Tensor | None]:
        """Record one step on a fixed positions buffer (recording runs nothing on CUDA: the
        caller then replays it for this batch). On CPU the "graph" is the same flow run
        plainly, now (its result is returned) and at each replay. ``takes``: the step takes
        what the last one primed (its ids are the primed plan's); with ``nxt`` it primes the
        next batch (plans it, exchanges it early or reads it ahead)."""
        source, pos = batch.source, batch.pos.clone()
        pos_next = None if nxt is None else nxt.pos.clone()
        ids = self.ahead.primed.prep.ids if takes and self.ahead.primed is not None else None
        comm = self.comm if nxt is None else self.dense_comm

        def flow() -> torch.Tensor:
            bucket, ahead = self.step.bucket, self.ahead
            env, bucket.env = bucket.env, comm  # (the dense all-reduce: see the class)
            if pos_next is not None:
                ahead.next_ids = lambda: self._table_ids(source.gather_ids(pos_next))
            try:
                with self.whole.capturing():
                    start = self.inputs.mark_start(self.env.device)
                    b = self.inputs.take(exact_primed(self.ahead, self.early), source, pos, ids)
                    out = self.step(b, global_batch, after_backward=self._after_backward(nxt))
                    if pos_next is not None:
                        self.inputs.fill_next(
                            exact_primed(self.ahead, self.early), source, pos_next, start
                        )
                if pos_next is not None and self.reads_ahead:  # (after the side stream joined)
                    self.whole.apply_stored_now()
                return out
            finally:
                bucket.env, ahead.next_ids = env, None

        if not self.graphed:
            out = flow()
            entry = _Entry(flow, pos, source, self._replayed_pending(), None, pos_next)
            entry.primed = self.ahead.primed
            return entry, out
        torch.cuda.synchronize(self.env.device)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (NCCL's watchdog, a data prefetcher) may use CUDA;
        # stream: its priority is the step's kernels' (streams.PRIORITIES)
        if streams.PRIORITIES and self._stream is None:
            self._stream = streams.priority_stream(self.env.device, "step")
        with torch.cuda.graph(graph, stream=self._stream, capture_error_mode="thread_local"):
            out = flow()
        grads = self._replayed_pending()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return _Entry(replay, pos, source, grads, graph, pos_next, self.ahead.primed), None

    def _replayed_pending(self) -> PendingGrads | None:
        """The gradient a captured step leaves, its batch record marked as a replay's: every
        replay restores it, so its counts must be read from the replay's sizes tables
        (:func:`~hetgmp.embedding.padded.whole.materialize`). A graph that reads ahead takes a
        record made outside the capture (the primed batch of an eager step): its host counts
        were that batch's, and an eager step or flush after a later replay pushed with them
        (a device assert at an epoch start or the final flush on 2 H100s, 2026-11-26)."""
        grads = self.whole.pending()
        if grads is not None:
            grads[0].replayed = True
        return grads

    def release_graphs(self) -> None:
        """Drop the captured graphs (they hold the exchange's communicator: before it goes,
        :func:`hetgmp.comm.launch.shutdown` calls this through ``env.closers``)."""
        self._drop()

    def _drop(self) -> None:
        """Forget the captured graphs (after the device is done with them)."""
        if self._entries and self.graphed:
            torch.cuda.synchronize(self.env.device)
        self._entries.clear()
