"""The training loop: global steps in lockstep over all ranks, logging, evaluation, checkpoints.

One *global step* = every rank takes its next batch (or an empty one when it has run out: the
distributed table needs every rank at every exchange), computes ``sum of losses / global batch
size``, back-propagates (the embedding captures its row gradients), sums dense gradients over
ranks and steps the dense optimizer (:mod:`hetgmp.train.step`). Per-rank batch counts are
exchanged once at start, so every rank knows each step's global batch size and the number of
steps without a per-step collective.

Batches come from :mod:`hetgmp.data.pipeline` (on the device, or prefetched by a thread) in
:class:`~hetgmp.data.loader.BatchLoader`'s order. In steady state the loop never waits for the
device: losses and counts stay on it until TRAIN lines (a non-finite loss stops the run there,
naming its step); time is measured between synced boundaries (:mod:`hetgmp.train.accounting`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from hetgmp.comm.collectives import all_gather_object, any_true
from hetgmp.comm.env import DistEnv
from hetgmp.data.device_batches import (
    DeviceBatch,
    EpochPlan,
    PendingBatch,
    ResidentSource,
    Slot,
    empty_batch,
    host_to_device,
    step_slots,
)
from hetgmp.data.format import Dataset
from hetgmp.data.loader import Batch
from hetgmp.data.pipeline import BatchSource, PipelineOptions, open_source
from hetgmp.embedding import engine_of
from hetgmp.models import CTRModel
from hetgmp.train.accounting import Interval, TrainClock, global_batch_sizes, stop_if_diverged
from hetgmp.train.async_loop import run_async
from hetgmp.train.checkpoint import LoadedCheckpoint, Position
from hetgmp.train.config import TrainConfig
from hetgmp.train.evaluate import EvalResult, evaluate
from hetgmp.train.graphed import GraphedStep, graph_support, multi_graph_support
from hetgmp.train.graphed_head import WARMUP_STEPS, GraphedHead, head_graph_support
from hetgmp.train.graphed_multi import MultiRankGraphedStep
from hetgmp.train.lookahead import read_ahead
from hetgmp.train.optim import make_dense_optimizer
from hetgmp.train.profile import NoMarks, PhaseProfiler
from hetgmp.train.report import global_counters, local_counters, results
from hetgmp.train.resume import restore_trainer, save_trainer
from hetgmp.train.runlog import RunLog
from hetgmp.train.step import TrainStep, table
from hetgmp.train.straggle import Straggler, parse_straggle
from hetgmp.train.tier_exchange import settle_exchange
from hetgmp.train.train_lines import log_train, note_repeats

__all__ = ["Trainer", "global_batch_sizes", "make_dense_optimizer"]


class Trainer:
    """Trains ``model`` (whose ``.embedding`` is the distributed table) on this rank's samples."""

    def __init__(
        self,
        cfg: TrainConfig,
        env: DistEnv,
        dataset: Dataset,
        model: CTRModel,
        log: RunLog,
        *,
        indices: np.ndarray,
        indices_of: Callable[[int], np.ndarray] | None = None,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.cfg, self.env, self.dataset, self.log = cfg, env, dataset, log
        self.model = model.to(env.device)
        # any rank's sample indices (work stealing builds its peers' batches; None: no stealing)
        self.indices, self.indices_of = indices, indices_of
        self.info = dict(info or {})  # identity of the run, checked when resuming
        self.amp = cfg.amp if cfg.amp is not None else env.device.type == "cuda"
        self.train_step = TrainStep(
            env, self.model, optimizer=cfg.dense_optimizer, lr=cfg.effective_dense_lr, amp=self.amp,
            sync_every=cfg.dense_sync_every,
        )  # fmt: skip
        self.run_step: TrainStep | GraphedStep | MultiRankGraphedStep = self.train_step
        self.graph_note: str | None = None
        self.counts = [int(c) for c in all_gather_object(env, int(indices.size))]
        self.steps_per_epoch = max(math.ceil(c / cfg.batch_size) for c in self.counts)
        warmup, prof_first = self._use_graphs()
        self.dense_params = self.train_step.dense_params
        self.dense_opt = self.train_step.optimizer
        self.position = Position(world_size=env.world_size)
        if self.steps_per_epoch == 0:
            raise ValueError(f"{dataset.root}: the training split is empty")
        self.total_steps = cfg.iter if cfg.iter else cfg.epochs * self.steps_per_epoch
        self.last_eval: EvalResult | None = None
        self.last_eval_step = -1
        self.clock = TrainClock(env.device, warmup)
        self.profiler = PhaseProfiler(
            env.device, self.model.embedding, first=prof_first, steps=cfg.profile_steps
        )
        self.data_source = ""  # which batch source fit() used, and why
        self._empty = empty_batch(dataset.meta.num_fields, dataset.meta.num_dense, env.device)
        self.counters_at_line: dict[str, float] = {}
        self.eval_counters: dict[str, float] = {}  # this rank's counters spent in evaluation
        self.samples_seen = 0  # global training samples of the steps run in this process
        self.samples_before = 0  # ... of the steps before a resumed checkpoint
        self.straggler = Straggler(
            parse_straggle(cfg.straggle), env.rank, env.world_size, env.device
        )  # (--straggle: a benchmark facility)
        self.extra_results: dict[str, Any] = {}  # (the async loop's per-rank figures)

    def _use_graphs(self) -> tuple[int, int]:
        """Replay the whole step as a CUDA graph where it applies (:mod:`.graphed`), else its
        dense part (:mod:`.graphed_head`); ``graph_note`` says why not the whole step. Returns
        the warm-up steps and the first profiled step (profiled steps run eagerly: inside the
        warm-up, not timed)."""
        cfg, env = self.cfg, self.env
        self.graph_note = graph_support(
            env, self.train_step, enabled=cfg.cuda_graphs, dense_optimizer=cfg.dense_optimizer
        )
        warmup, prof_first = cfg.warmup_steps, cfg.warmup_steps
        if self.graph_note is not None and env.world_size > 1:
            note = multi_graph_support(self.train_step, cfg)
            if note is None:
                self.use_whole_step_graph()
            self.graph_note = note
        if self.graph_note is None:
            if not isinstance(self.run_step, MultiRankGraphedStep):
                self.run_step = GraphedStep(self.train_step, time_replays=cfg.profile_steps)
            if cfg.profile_steps:
                prof_first = 1  # (step 0 compiles)
                warmup = max(warmup, cfg.profile_steps + WARMUP_STEPS + 1)
        elif head_graph_support(env, self.model, enabled=cfg.cuda_graphs):
            self.train_step.head = GraphedHead(self.model, self.train_step.loss_fn, amp=self.amp)
        return warmup, prof_first

    def use_whole_step_graph(self) -> None:
        """Several ranks: replay the whole step as one graph (:mod:`.graphed_multi`; on CPU
        its flow runs plainly, which tests use). Collective (the exchange's communicator);
        before the first step."""
        whole = table(self.model).whole_step()
        if whole is None:
            raise ValueError("a multi-rank whole-step graph needs the padded exchange")
        self.run_step = MultiRankGraphedStep(
            self.train_step, whole, whole.comm(), batch_size=self.cfg.batch_size,
            time_replays=self.cfg.profile_steps, counts=self.counts, steps_per_epoch=self.steps_per_epoch,
            boundary=self._boundary_after,
        )  # fmt: skip
        self.train_step.head = None

    def step_graph(self) -> str:
        """What of a training step is a CUDA graph, and why not more (logs and results)."""
        if self.graph_note is None:
            return "whole step"
        if self.train_step.head is not None:
            return f"dense part (whole step: {self.graph_note})"
        return f"none ({self.graph_note})"

    @property
    def samples_total(self) -> int:
        """Global training samples of the whole run (the resumed checkpoint's included)."""
        return self.samples_before + self.samples_seen

    # ---- one global step -------------------------------------------------------------------
    def step(self, batch: Batch | None, global_batch: int) -> tuple[float, float, int]:
        """One global step on this rank's host ``batch`` (None: nothing left). Returns this
        rank's (loss sum, correct predictions, samples); reading them waits for the device
        (:meth:`fit` keeps them on the device instead).

        Collective: every rank calls it every step, with None once out of data (the table
        needs every rank at every exchange). The loss is scaled by ``global_batch``, the
        samples of this step over all ranks; the rows' update is applied at the next step."""
        db = self._empty if batch is None else host_to_device(batch, self.env.device)
        self._tell_full(None)  # (batches of the caller's: no epoch verdicts)
        loss, correct = self.run_step(db, global_batch).tolist()
        return loss, correct, len(db)

    def _tell_full(self, global_batch: int | None, fits: bool = True) -> None:
        """Tell the table whether every rank's batch is full and fits (``peers_full``; None
        unsays it: batches of the caller's, :meth:`step`, or after ``fit``)."""
        if (engine := engine_of(self.model.embedding)) is not None:
            full = fits and global_batch == self.cfg.batch_size * self.env.world_size
            engine.peers_full(None if global_batch is None else full)

    # ---- checkpoint / resume ---------------------------------------------------------------
    def checkpoint(self) -> None:
        """Flush the table and write a checkpoint at the current position (collective)."""
        self.train_step.average_dense()
        save_trainer(self)

    def restore(self, ck: LoadedCheckpoint) -> None:
        """Load a verified checkpoint: rows, dense state, optimizer states, position, RNG."""
        restore_trainer(self, ck)

    # ---- the loop --------------------------------------------------------------------------
    def _due(self, every: int, step: int | None = None) -> bool:
        step = self.position.step if step is None else step
        return every > 0 and step % every == 0

    def _boundary_after(self, step: int) -> bool:
        """Whether an evaluation, a checkpoint or the end of the run follows global step
        ``step`` (counted from 1): the whole-step graph then leaves the next batch alone."""
        cfg = self.cfg
        return (
            step >= self.total_steps
            or (cfg.val and self._due(cfg.eval_every, step))
            or (cfg.checkpoint_dir is not None and self._due(cfg.checkpoint_every, step))
        )

    def fit(self) -> dict[str, Any]:
        """Train until ``--iter`` steps or ``--epochs`` epochs; returns the final results."""
        cfg = self.cfg
        self.info.update(steps_per_epoch=self.steps_per_epoch, rank_samples=self.counts)
        self.counters_at_line = global_counters(self.env, self.model.embedding)
        try:
            if not run_async(self):  # (--sync async --max-lag != 0: unequal step counts)
                note_repeats(self)
                self.log.start_bar(self.total_steps, initial=self.position.step)
                self._loop_lockstep()
        finally:
            self.profiler.remove_hooks()
            self._tell_full(None)
        self.train_step.average_dense()
        table(self.model).flush()
        if cfg.val and (self.last_eval is None or self.last_eval_step != self.position.step):
            self.run_eval()
        if cfg.checkpoint_dir is not None and not self._due(cfg.checkpoint_every):
            self.checkpoint()
        return self.results()

    def _loop_lockstep(self) -> None:
        cfg, pos = self.cfg, self.position
        plan = EpochPlan(self.dataset.train, self.indices, cfg.batch_size, cfg.shuffle, cfg.seed)
        slots = step_slots(plan, step=pos.step, epoch=pos.epoch, batch=pos.batch,
                           steps_per_epoch=self.steps_per_epoch, total_steps=self.total_steps)  # fmt: skip
        source = self.open_source(plan, slots)
        try:
            self._loop(source)
        finally:
            source.close()

    def open_source(self, plan: EpochPlan, slots: Iterator[Slot]) -> BatchSource:
        """The batch source of ``plan`` following ``slots`` (logs which one, and why)."""
        cfg = self.cfg
        opts = PipelineOptions(cfg.data_on_device, cfg.device_data_budget_gb, cfg.prefetch_batches)
        meta = self.dataset.meta
        pad_from = meta.num_fields if meta.multi_hot else None  # (bags padded into the ids)
        source, why = open_source(
            plan, slots, self.env.device, opts, num_rows=meta.num_embeddings, pad_from=pad_from,
            others_fit=None if cfg.sync == "async" else self._all_fit,  # (async: own pace)
        )  # fmt: skip
        self.data_source = source.name
        if isinstance(self.run_step, GraphedStep):
            self._one_source(source, self.run_step)
        if isinstance(self.run_step, MultiRankGraphedStep):
            self._multi_source(source)  # (it may fall back to eager steps: asked again below)
        multi = isinstance(self.run_step, MultiRankGraphedStep)
        settle_exchange(table(self.model), self.cfg, multi, self.log)
        self.log.info(f"data: {why}")
        left = self.total_steps - self.position.step
        source = read_ahead(source, self.model, left, epoch_held=multi)
        what = self.step_graph()
        self.log.info(
            f"step: eager kernels ({self.graph_note})"
            if what.startswith("none")
            else f"step: one CUDA graph of the {what} per full batch (after 2 eager steps)"
            + getattr(self.run_step, "note", "")
        )
        return source

    def _all_fit(self, fits: bool) -> bool:
        """(Collective) whether every rank's samples fit on its device (lockstep ranks must
        agree: a resident rank replays the whole step, the others would step eagerly)."""
        return not any_true(self.env, not fits)

    def _one_source(self, source: BatchSource, run: GraphedStep) -> None:
        """The one-rank graph gathers resident batches itself; compact bags need their epochs'
        verdicts (capacity), which only resident samples give: else the bags' variable layout
        and the dense part's graph (multi_hot.ONE_RANK_COMPACT)."""
        if isinstance(source, ResidentSource):
            source.deferred = True
            if run.compact_bags():
                source.epoch_check = lambda sparse, pos, bs: run.epoch_check(
                    sparse, pos, bs, self.log.info
                )
        elif run.compact_bags() and self.model.bags is not None:
            self.model.bags = dataclasses.replace(self.model.bags, fixed=False)
            self._dense_graph_only(f"multi-hot bags: the samples are not resident ({source.name})")

    def _multi_source(self, source: BatchSource) -> None:
        """The multi-rank graph gathers resident batches itself and needs each epoch's
        verdicts (capacities); other sources train eagerly, with the dense part's graph."""
        run = self.run_step
        assert isinstance(run, MultiRankGraphedStep)
        if not isinstance(source, ResidentSource):
            self._dense_graph_only(f"several ranks: the samples are not resident ({source.name})")
            return
        source.deferred = True
        source.epoch_check = lambda sparse, pos, bs: run.epoch_check(sparse, pos, bs, self.log.info)
        run.epoch_source = source

    def _dense_graph_only(self, why: str) -> None:
        """The whole step eager after all (``why``: for the log), its dense part one graph."""
        self.graph_note, self.run_step = why, self.train_step
        if head_graph_support(self.env, self.model, enabled=self.cfg.cuda_graphs):
            self.train_step.head = GraphedHead(self.model, self.train_step.loss_fn, amp=self.amp)

    def _loop(self, source: BatchSource) -> None:
        interval = Interval(self.env.device)
        self.clock.resume()
        while self.position.step < self.total_steps:
            marks = self.profiler.begin(self.clock.steps_run)
            self.straggler.begin()
            t0 = time.perf_counter()
            slot, batch = source.next()
            wait = time.perf_counter() - t0
            self._run_step(slot, batch, wait, interval, marks)
            self.straggler.end()
            interval = self._boundaries(interval)
        self.clock.pause()
        if interval.steps:
            log_train(self, interval)

    def _run_step(
        self,
        slot: Slot,
        batch: DeviceBatch | PendingBatch | None,
        wait: float,
        interval: Interval,
        marks: NoMarks | PhaseProfiler,
    ) -> None:
        """Train on the slot's batch and count it (no host sync)."""
        marks.mark("data")
        gb = global_batch_sizes(self.counts, self.cfg.batch_size, slot.batch)
        self._tell_full(gb, getattr(batch, "fits", True))
        stats = self.run_step(self._empty if batch is None else batch, gb, marks)
        self.profiler.end(wait)
        interval.add(stats, 0 if batch is None else len(batch), gb, slot.epoch, slot.step + 1)
        interval.data_wait_s += wait
        ws = self.env.world_size
        if slot.batch + 1 == self.steps_per_epoch:  # epoch done: the next step starts the next
            self.position = Position(slot.step + 1, slot.epoch + 1, 0, ws)
        else:
            self.position = Position(slot.step + 1, slot.epoch, slot.batch + 1, ws)
        self.clock.count(gb, wait)
        self.samples_seen += gb
        self.log.advance()

    def _boundaries(self, interval: Interval) -> Interval:
        """TRAIN line, evaluation, checkpoint when due (each outside the timed training)."""
        cfg = self.cfg
        logged = self._due(cfg.log_every)
        if logged:
            with self.clock.paused():
                log_train(self, interval)
            interval = Interval(self.env.device)
        evaluate = cfg.val and self._due(cfg.eval_every)
        save = cfg.checkpoint_dir is not None and self._due(cfg.checkpoint_every)
        if (evaluate or save) and not logged:
            with self.clock.paused():
                stop_if_diverged(self.env, interval)  # (never evaluate or save NaN weights)
        if evaluate:
            with self.clock.paused():
                self.run_eval()
        if save:
            with self.clock.paused():
                self.checkpoint()
        return interval

    def run_eval(self) -> EvalResult:
        """Flush pending updates and evaluate on the whole test split (collective)."""
        self.train_step.average_dense()
        table(self.model).flush()
        before = local_counters(self.model.embedding)
        res = evaluate(
            self.model,
            self.dataset.test,
            self.env,
            batch_size=self.cfg.eval_batch_size,
            amp=self.amp,
            prefetch=self.cfg.prefetch_batches,
        )
        for k, v in local_counters(self.model.embedding).items():
            self.eval_counters[k] = self.eval_counters.get(k, 0.0) + v - before.get(k, 0.0)
        self.last_eval = res
        self.last_eval_step = self.position.step
        self.log.metrics(
            "EVAL", self.position.step, {**res.fields(), "samples_seen": self.samples_total}
        )
        return res

    def results(self) -> dict[str, Any]:
        """The final results (collective): metrics, speed, counters, memory, profile."""
        return results(self)
