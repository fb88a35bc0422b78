"""The trainer's interval lines: the TRAIN line (one all-reduce of the interval's sums) and the
note that ``--iter`` runs past the first epoch. Split from :mod:`.trainer`, which holds the
loop."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from hetgmp.comm.collectives import all_reduce_sum
from hetgmp.train.accounting import Interval, stop_if_diverged
from hetgmp.train.embedding_stats import summarize_counters
from hetgmp.train.report import global_counters

if TYPE_CHECKING:  # pragma: no cover
    from hetgmp.train.trainer_view import TrainerView


def note_repeats(tr: TrainerView) -> None:
    """Say so when ``--iter`` runs past the first epoch: samples repeat from then on, so
    TRAIN loss falls below EVAL's and runs of different world sizes at equal ``--iter``
    no longer compare (a 2-GPU run "worse than 1 GPU" was in its second epoch)."""
    if not tr.cfg.iter or tr.total_steps <= tr.steps_per_epoch:
        return
    tr.log.info(
        f"note: --iter {tr.cfg.iter} is {tr.total_steps / tr.steps_per_epoch:.2f} "
        f"epochs of the training split ({tr.steps_per_epoch} global steps each, "
        f"{sum(tr.counts)} samples): from step {tr.steps_per_epoch + 1} on samples "
        f"repeat, so TRAIN loss is on already-seen samples (TRAIN lines show the epoch)",
        steps_per_epoch=tr.steps_per_epoch,
    )


def log_train(tr: TrainerView, iv: Interval) -> None:
    """One TRAIN line: the interval's sums read from the device in one all-reduce (collective);
    the table's counters since the last line (``tr.counters_at_line``)."""
    loss, right, _ = iv.totals()
    host = [loss, right, float(iv.samples), tr.clock.take_interval(), iv.data_wait_s]
    vec = torch.tensor(host, dtype=torch.float64, device=tr.env.device)
    loss_sum, correct, samples, secs, wait = all_reduce_sum(tr.env, vec).tolist()
    if not math.isfinite(loss_sum):  # (every rank sees it: it is the reduced sum)
        stop_if_diverged(tr.env, iv, loss_sum / max(1.0, samples), at=tr.position.step)
    ws = tr.env.world_size
    seconds = secs / ws  # ranks run in lockstep; average their clocks
    now = global_counters(tr.env, tr.model.embedding)
    delta = {k: now[k] - tr.counters_at_line.get(k, 0.0) for k in now}
    tr.counters_at_line = now
    fields: dict[str, Any] = {
        "loss": loss_sum / max(1.0, samples),
        "acc": correct / max(1.0, samples),
        "time": seconds,
        "speed": iv.global_samples / seconds if seconds > 0 else 0.0,
        "data_wait": 1e3 * wait / ws / max(1, iv.steps),  # ms per step, mean over ranks
    }
    fields.update(summarize_counters(delta, iv.global_samples))
    fields["epoch"] = iv.epoch
    tr.clock.intervals.append((fields["speed"], iv.epoch))
    tr.log.metrics("TRAIN", tr.position.step, fields)
