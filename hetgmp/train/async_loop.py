"""The training loop of ``--sync async`` with ``--max-lag`` != 0: ranks run unequal step
counts, and training ends on a global sample budget.

Under ``--sync collective`` (and ``--max-lag 0``) every rank runs the same global steps, so the
slowest rank sets the pace. Here each rank trains at its own pace:

* **Budget.** The run trains ``--epochs`` x the training samples (``--iter N``: ``N`` x ranks x
  ``--batch-size``), summed over ranks. Each rank draws batches from its own shard, epoch after
  epoch in :class:`~hetgmp.data.loader.BatchLoader`'s deterministic order (shuffled by
  ``(seed, epoch)``); with work stealing (the default, :mod:`hetgmp.train.work_steal`) a rank
  that has taken all its batches of an epoch takes the slower ranks' unclaimed ones, so every
  epoch trains each batch once; without it (``--no-work-stealing``) it cycles its own shard
  and a fast rank simply does more steps on it.
* **Stop rule.** Before a step a rank *commits* its batch: the samples are added to its count,
  which its clock messages carry to every peer (:meth:`AsyncStep.commit`: at once near the
  budget, else with the next step's messages). It starts the step
  only while the samples of all ranks, as its service has seen them, stay below the budget;
  else it stops and sets its clock to "done" so that nobody waits for it any more. As every
  view is a lower bound of the true sum, the run trains at least the budget, and at most about
  one batch per rank more (the batches committed while the others' last counts were in flight).
* **Per-clock bound.** The wait before a step is the one of ``--max-lag``
  (:meth:`AsyncStep.wait_turn`), interrupted when the budget is reached. A persistent
  straggler therefore caps the fast ranks' lead at ``--max-lag`` steps, after which they move
  at its pace again: ``--max-lag -1`` lifts the cap (the per-row ``--bound`` still holds).
* **Reads sent ahead.** Right after a step's backward the rank takes its next batch and
  sends that batch's push and reads (:meth:`DistributedEmbedding.send_ahead`), so their
  round trip overlaps the optimizer, the dense exchange and the loading; the next step's
  forward takes the answers. When the budget stops the loop they are dropped.
* **Dense parameters** go through :class:`~hetgmp.train.dense_server.DenseServer` (no
  collective during training). The loss of a step is scaled as if every rank had this batch
  (``ranks x len(batch)``), as in the collective path's steady state.

The end is collective, as before: the dense server's final pull, the table's flush, evaluation,
checkpoint (:meth:`Trainer.fit`). TRAIN lines during training show rank 0's own steps; the
last one sums every rank's. ``speed`` is the sum of the ranks' rates, each over its own steps
after ``--warmup-steps`` (``speed_per_rank`` in the results; the first steps compile kernels
and capture CUDA graphs, and the lockstep loop leaves its warm-up out too); if a rank never
got past its warm-up, all samples over the slowest rank's loop time.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import torch

from hetgmp.comm.collectives import all_gather_object
from hetgmp.data.device_batches import EpochPlan, Slot, step_slots
from hetgmp.data.pipeline import BatchSource
from hetgmp.embedding import engine_of
from hetgmp.train.accounting import Interval, diverged
from hetgmp.train.checkpoint import Position
from hetgmp.train.dense_server import DenseServer
from hetgmp.train.step import table
from hetgmp.train.work_steal import Stealer, epoch_coverage

LAG_CAP_HINT_SHARE = 0.1  # (of a rank's loop time at the cap: the end-of-run hint)

if TYPE_CHECKING:
    from hetgmp.embedding.rowservice import AsyncStep
    from hetgmp.train.trainer_view import TrainerView


def sample_budget(
    cfg_iter: int, epochs: int, world: int, batch_size: int, counts: list[int]
) -> int:
    """Global training samples of an unequal-steps run (see the module docstring)."""
    return cfg_iter * world * batch_size if cfg_iter else epochs * sum(counts)


class AsyncLoop:
    """One rank's budget-bound training (construction is collective: the dense server)."""

    def __init__(self, tr: TrainerView, engine: AsyncStep) -> None:
        cfg, env = tr.cfg, tr.env
        self.tr, self.engine = tr, engine
        self.budget = sample_budget(cfg.iter, cfg.epochs, env.world_size, cfg.batch_size, tr.counts)
        self.plan = EpochPlan(tr.dataset.train, tr.indices, cfg.batch_size, cfg.shuffle, cfg.seed)
        self.stealer: Stealer | None = None
        if cfg.work_stealing and tr.indices_of is not None:  # (before the server's barrier:
            # every rank answers claims before any rank can make one)
            self.stealer = Stealer(engine, self.plan, tr.indices_of, env.device)
        self.server = DenseServer(env, tr.dense_params, engine, cfg.dense_sync_every)
        tr.train_step.dense_server = self.server
        self.steps = 0
        self.bad_step: int | None = None  # this rank's first step with a non-finite loss
        self.sums = torch.zeros(2, dtype=torch.float64, device=env.device)  # loss, correct
        self.seconds = 0.0
        self.data_wait_s = 0.0
        self.answer_wait_s = (0.0, 0.0)  # (rows, dense) at the end of training
        # (time, samples, data wait) at the end of the warm-up steps, and the steady segment's
        # (seconds, samples, data wait) after them: the speed excludes the warm-up, as the
        # lockstep loop's does (first steps compile kernels and capture CUDA graphs)
        self.warm: tuple[float, int, float] | None = None
        self.steady: tuple[float, int, float] | None = None
        self.stealing: int | None = None  # the epoch this rank is stealing batches of
        self.epoch = 0  # the epoch of this rank's own batches
        self.held: tuple[Slot, Any] | None = None  # its next epoch's first batch, while stealing

    def run(self) -> None:
        """Train until the budget is spent, then meet the others for the dense pull."""
        tr, cfg = self.tr, self.tr.cfg
        plan = self.plan
        tr.log.info(
            f"async: training until {self.budget} samples over all ranks ("
            + (
                "work stealing: every epoch trains each batch once"
                if self.stealer is not None
                else "each rank cycles its own shard"
            )
            + f"; --max-lag {cfg.max_lag}, dense exchange every {cfg.dense_sync_every} "
            "step(s) through the ranks' services); TRAIN lines show rank 0's own steps"
        )
        total = -(-self.budget // max(1, cfg.batch_size * tr.env.world_size))
        tr.log.start_bar(total)
        t0 = time.perf_counter()
        if plan.local_batches:
            slots = step_slots(
                plan, step=0, epoch=0, batch=0, steps_per_epoch=plan.local_batches,
                total_steps=self.budget + 1,
            )  # fmt: skip
            source = tr.open_source(plan, slots)
            try:
                self._train(source)
            finally:
                source.close()
        end = time.perf_counter()
        self.seconds = end - t0
        # (the waits for answers during training: the end's exchanges and meetings wait for
        # the slowest rank, in no phase)
        self.answer_wait_s = (self.engine.phase_s["peer_wait"], self.server.channel.wait_s)
        if self.warm is not None:
            w_t, w_samples, w_wait = self.warm
            self.steady = (end - w_t, self.engine.samples - w_samples, self.data_wait_s - w_wait)
        self.engine.drop_ahead()  # (the budget stopped it: reads sent for no step)
        self.engine.finish()  # (nobody waits for this rank any more)
        self.server.finish()
        self._report()

    def _train(self, source: BatchSource) -> None:
        tr, w = self.tr, self.tr.env.world_size
        iv = Interval(tr.env.device)
        ahead: list[tuple[Slot, Any, float]] = []  # the next batch (and its loading time),
        # taken during a step
        while self.engine.wait_turn(self.budget):
            tr.straggler.begin()
            t0 = time.perf_counter()
            slot, batch, _ = ahead.pop() if ahead else (*self._next(source), 0.0)
            wait = time.perf_counter() - t0
            assert batch is not None  # (the slots of a rank's own epochs are all local)
            self.engine.commit(len(batch), self.budget)
            t1 = time.perf_counter()
            stats = tr.train_step(
                batch, w * len(batch), after_backward=lambda: ahead.append(self._ahead(source))
            )
            step_s = time.perf_counter() - t1
            if ahead:  # (the next batch's loading happened in this step: data, not step)
                step_s -= ahead[-1][2]
                wait += ahead[-1][2]
            self.engine.phase_s["step"] += step_s
            iv.add(stats, len(batch), len(batch), slot.epoch, self.steps + 1)
            self.sums += stats
            iv.data_wait_s += wait
            self.data_wait_s += wait
            self.steps += 1
            if self.steps == tr.cfg.warmup_steps:
                self.warm = (time.perf_counter(), self.engine.samples, self.data_wait_s)
            tr.log.advance()
            tr.straggler.end()
            if self.steps % tr.cfg.log_every == 0:
                self._log_local(iv)
                iv = Interval(tr.env.device)
        self.bad_step = iv.totals()[2]  # (the steps after the last TRAIN line: _report says)

    def _ahead(self, source: BatchSource) -> tuple[Slot, Any, float]:
        """(After a step's backward) take the next batch and send its reads now
        (:meth:`DistributedEmbedding.send_ahead`): their round trip overlaps the rest of the
        step. If the budget then stops the loop, :meth:`run` drops them. Also returns the
        seconds the batch took to load."""
        t0 = time.perf_counter()
        slot, batch = self._next(source)
        loading = time.perf_counter() - t0
        sparse = getattr(batch, "sparse", None)
        if sparse is not None:  # (the ids the step's lookup hands the table: bags flattened)
            table(self.tr.model).send_ahead(self.tr.model.table_ids(sparse))
        return slot, batch, loading

    def _next(self, source: BatchSource) -> tuple[Slot, Any]:
        """The next batch: this rank's own, in order, unless a peer claimed it; once its own
        batches of an epoch are all taken (the source moves on to the next epoch), batches
        claimed from the slower ranks until none of that epoch is left anywhere
        (:mod:`hetgmp.train.work_steal`)."""
        st = self.stealer
        if st is None:
            return source.next()
        while True:
            if self.stealing is not None:
                got = st.steal(self.stealing)
                if got is not None:
                    return got
                self.stealing = None
            slot, batch = self.held if self.held is not None else source.next()
            self.held = None
            assert batch is not None  # (the slots of a rank's own epochs are all local)
            if slot.epoch > self.epoch:  # (its own batches of self.epoch are all taken)
                self.held, self.stealing, self.epoch = (slot, batch), self.epoch, slot.epoch
                continue
            if st.queue.own(slot.epoch, slot.batch):
                st.took_own(slot)
                return slot, batch
            # (a peer claimed it, and the rest of the epoch: skip to the next epoch's)

    def _log_local(self, iv: Interval) -> None:
        """Rank 0's own TRAIN line (no collective: the ranks are at different steps)."""
        n = max(1, iv.samples)
        loss, correct, bad = iv.totals()
        if bad is not None:  # (this rank stops; its peers learn it as from any failed rank)
            raise diverged(bad, self.tr.env.rank, loss / n)
        seen = sum(self.engine.peer_samples)
        fields: dict[str, Any] = {"loss": loss / n, "acc": correct / n, "rank_samples": iv.samples}
        fields["progress"] = min(1.0, seen / max(1, self.budget))
        fields["epoch"] = iv.epoch
        self.tr.log.metrics("TRAIN", self.steps, fields)

    def _report(self) -> None:
        """(Collective) the run's totals: steps and samples per rank, global speed."""
        tr, env = self.tr, self.tr.env
        loss, correct = self.sums.tolist()
        st = self.stealer.stats() if self.stealer is not None else {}
        mine = {"steps": self.steps, "samples": self.engine.samples, "secs": self.seconds,
                "loss": loss, "correct": correct, "stolen": st.get("stolen", 0),
                "claimed_from": st.get("claimed_from", 0), "phase": self._phase_ms(),
                "steady": self.steady, "received": dict(self.engine.rpc.received),
                "bad_step": self.bad_step}  # fmt: skip
        ranks = all_gather_object(env, mine)
        bad = [(int(r["bad_step"]), k) for k, r in enumerate(ranks) if r["bad_step"]]
        if bad:  # (every rank raises: all see the gathered steps)
            raise diverged(*min(bad), math.nan)
        steps = [int(r["steps"]) for r in ranks]
        samples = [int(r["samples"]) for r in ranks]
        secs = max(float(r["secs"]) for r in ranks)
        total = sum(samples)
        tr.samples_seen = total
        shard = max(1, sum(tr.counts))
        tr.position = Position(max(steps), total // shard, 0, env.world_size)
        speed, rates = self._set_clock(secs, total, [r["steady"] for r in ranks])
        tail = max(1, total)
        tr.log.metrics(
            "TRAIN",
            max(steps),
            {
                "loss": sum(float(r["loss"]) for r in ranks) / tail,
                "acc": sum(float(r["correct"]) for r in ranks) / tail,
                "time": secs,
                "speed": speed,
                "samples": total,
                "steps": "/".join(map(str, steps)),
            },
        )
        tr.extra_results["async"] = {
            "budget": self.budget,
            "samples_per_rank": samples,
            "steps_per_rank": steps,
            "seconds_per_rank": [float(r["secs"]) for r in ranks],
            # each rank's samples/s after its warm-up steps (None: a rank took no more steps)
            "speed_per_rank": rates,
            "max_lag": tr.cfg.max_lag,
            "dense_sync_every": tr.cfg.dense_sync_every,
            "work_stealing": self.stealer is not None,
            "stolen_per_rank": [int(r["stolen"]) for r in ranks],  # batches taken from peers
            "claimed_from_per_rank": [int(r["claimed_from"]) for r in ranks],  # batches peers took
            "coverage": self._coverage(),
            "phase_ms_per_step": [r["phase"] for r in ranks],
            # messages each rank's service received, by kind, per step of all the others
            "messages_per_peer_step": [
                _per_step(r["received"], sum(steps) - s) for r, s in zip(ranks, steps, strict=True)
            ],
            "clock_wait_share_per_rank": [_wait_share(r["phase"]) for r in ranks],
            **self.server.stats(),
        }
        self._hint_lag_cap(tr.extra_results["async"]["clock_wait_share_per_rank"])

    def _set_clock(
        self, secs: float, total: int, steady: list[tuple[float, int, float] | None]
    ) -> tuple[float, list[float] | None]:
        """The trainer's clock for the results, and ``(global speed, each rank's rate)``. The
        speed is the sum of the ranks' steady rates (each over its own steps after
        ``--warmup-steps``: the ranks run side by side at unequal steps; the first steps
        compile kernels and capture CUDA graphs, as the lockstep loop's warm-up does), or,
        when a rank never got past its warm-up, all samples over the loop's wall time."""
        clock, rates = self.tr.clock, steady_rates(steady)
        clock.steps_run = self.steps
        if rates is None or self.steady is None or sum(rates) <= 0:
            clock.warmup_steps = 0
            clock.timing.update(steady_s=secs, steady_samples=total)
            clock.steady_data_wait_s = self.data_wait_s
            return (total / secs if secs > 0 else 0.0), rates
        speed = sum(rates)
        steady_total = sum(s[1] for s in steady if s is not None)
        steady_s = steady_total / speed  # (the wall time of those samples at that speed)
        clock.warmup_steps = self.tr.cfg.warmup_steps
        clock.timing.update(
            steady_s=steady_s, steady_samples=steady_total,
            warmup_s=max(0.0, secs - steady_s), warmup_samples=total - steady_total,
        )  # fmt: skip
        clock.steady_data_wait_s = self.steady[2]
        return speed, rates

    def _hint_lag_cap(self, shares: list[float]) -> None:
        """A rank that waited a good part of its time at the ``--max-lag`` cap had a
        persistent straggler to wait for: say so, and how to lift the cap."""
        lag, worst = self.tr.cfg.max_lag, max(range(len(shares)), key=shares.__getitem__)
        if lag > 0 and shares[worst] >= LAG_CAP_HINT_SHARE:
            self.tr.log.info(
                f"async: rank {worst} spent {shares[worst]:.0%} of its training time waiting "
                f"at the --max-lag {lag} cap for a slower rank; with a persistent straggler a "
                "finite --max-lag only delays the moment the others fall to its pace, "
                "--max-lag -1 lifts the cap (the per-row --bound still holds)"
            )

    def _phase_ms(self) -> dict[str, float]:
        """This rank's mean ms per step by phase: ``step`` (the training step), inside it
        ``push``, ``read`` (the embedding's exchanges) and ``dense`` (the dense exchange), and
        ``compute`` (the rest of the step, waits excluded); ``data`` (its batch, ``steal``
        included); ``clock_wait`` (``--max-lag``, before and inside the steps); ``loop``
        (all of it). ``peer_wait`` and ``dense_wait``: the parts of the exchanges spent
        waiting for (and taking) the peers' answers (rows; dense shards) during training (the
        end's final exchanges wait for the slowest rank: left out)."""
        ph = dict(self.engine.phase_s)
        in_step = ph.pop("clock_wait_in_step", 0.0)
        ph["data"] = self.data_wait_s
        ph["peer_wait"], ph["dense_wait"] = self.answer_wait_s
        inside = sum(ph.get(k, 0.0) for k in ("push", "read", "dense"))
        ph["compute"] = ph.get("step", 0.0) - inside - in_step
        ph["loop"] = self.seconds  # (an injected --straggle delay is in it, in no phase)
        n = max(1, self.steps)
        return {k: round(1000 * v / n, 3) for k, v in sorted(ph.items())}

    def _coverage(self) -> dict[str, Any] | None:
        """(Collective when stealing) :func:`~hetgmp.train.work_steal.epoch_coverage`."""
        if self.stealer is None:
            return None
        batches = [-(-c // max(1, self.tr.cfg.batch_size)) for c in self.tr.counts]
        return epoch_coverage(self.tr.env, self.stealer.trained, batches)


def steady_rates(steady: list[tuple[float, int, float] | None]) -> list[float] | None:
    """Each rank's samples per second over its steps after the warm-up (``steady``: per rank
    ``(seconds, samples, data wait)`` or None), or None if a rank has no such segment."""
    if any(s is None or s[0] <= 0 for s in steady):
        return None
    return [s[1] / s[0] for s in steady if s is not None]


def _per_step(counts: dict[str, int], steps: int) -> dict[str, float]:
    """Message counts per step (the kinds received at all)."""
    return {k: round(v / max(1, steps), 3) for k, v in sorted(counts.items()) if v}


def _wait_share(phase_ms: dict[str, float]) -> float:
    """The share of a rank's loop time spent waiting at the ``--max-lag`` cap."""
    loop = phase_ms.get("loop", 0.0)
    return round(phase_ms.get("clock_wait", 0.0) / loop, 4) if loop > 0 else 0.0


def run_async(tr: TrainerView) -> bool:
    """Run :class:`AsyncLoop` when this run trains with unequal step counts (True), else
    leave the lockstep loop to the trainer (False)."""
    table_engine = engine_of(tr.model.embedding)
    engine = table_engine.async_engine() if table_engine is not None else None
    if not tr.cfg.unequal_steps or engine is None:  # (one rank: nothing to be unequal with)
        return False
    AsyncLoop(tr, engine).run()
    return True
