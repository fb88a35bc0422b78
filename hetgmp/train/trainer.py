"""The training loop: global steps in lockstep over all ranks, logging, evaluation, checkpoints.

One *global step* = every rank takes its next batch (or an empty one when it has run out: the
distributed table needs every rank at every exchange), computes ``sum of losses / global batch
size``, back-propagates (the embedding captures its row gradients), sums dense gradients over
ranks and steps the dense optimizer. Per-rank batch counts are exchanged once at start, so every
rank knows each step's global batch size and the number of steps without a per-step collective.
"""

from __future__ import annotations

import dataclasses
import math
import resource
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from hetgmp.comm.collectives import all_gather_object, all_reduce_sum
from hetgmp.comm.env import DistEnv
from hetgmp.config import to_dict
from hetgmp.data.format import Dataset
from hetgmp.data.loader import Batch, BatchLoader
from hetgmp.models import CTRModel
from hetgmp.train.checkpoint import (
    LoadedCheckpoint,
    Position,
    check_compatible,
    save_checkpoint,
    set_rng_state,
)
from hetgmp.train.config import TrainConfig
from hetgmp.train.dense_sync import sum_dense_grads
from hetgmp.train.embedding_stats import summarize_counters
from hetgmp.train.evaluate import EvalResult, evaluate
from hetgmp.train.runlog import RunLog


def make_dense_optimizer(name: str, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The dense optimizer for ``--dense-optimizer``."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"--dense-optimizer {name!r}: expected sgd, adagrad or adam")


def global_batch_sizes(counts: list[int], batch_size: int, step_in_epoch: int) -> int:
    """Samples all ranks together process at ``step_in_epoch`` (ranks hold ``counts`` samples)."""
    return sum(min(batch_size, max(0, c - step_in_epoch * batch_size)) for c in counts)


@dataclasses.dataclass
class Interval:
    """Accumulators between two TRAIN lines."""

    loss_sum: float = 0.0
    correct: float = 0.0
    samples: int = 0
    global_samples: int = 0
    seconds: float = 0.0
    steps: int = 0
    epoch: int = 0  # epoch of the interval's last step (0 = first pass over the samples)


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
        info: dict[str, Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.env = env
        self.dataset = dataset
        self.model = model.to(env.device)
        self.log = log
        self.indices = indices
        self.info = dict(info or {})  # identity of the run, checked when resuming
        self.dense_params = model.dense_parameters()
        self.dense_opt = make_dense_optimizer(
            cfg.dense_optimizer, self.dense_params, cfg.effective_dense_lr
        )
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
        self.position = Position(world_size=env.world_size)
        counts = all_gather_object(env, int(indices.size))
        self.counts = [int(c) for c in counts]
        self.steps_per_epoch = max(math.ceil(c / cfg.batch_size) for c in self.counts)
        if self.steps_per_epoch == 0:
            raise ValueError(f"{dataset.root}: the training split is empty")
        self.total_steps = cfg.iter if cfg.iter else cfg.epochs * self.steps_per_epoch
        self.last_eval: EvalResult | None = None
        self.last_eval_step = -1
        self._timing = {"warmup_s": 0.0, "warmup_samples": 0, "steady_s": 0.0, "steady_samples": 0}
        self._counters0: dict[str, float] = {}
        self._eval_counters: dict[str, float] = {}  # this rank's counters spent in evaluation
        self.samples_seen = 0  # global training samples of the steps run in this process

    # ---- one global step -------------------------------------------------------------------
    def _tensors(
        self, batch: Batch | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        dev = self.env.device
        if batch is None:
            nf = self.dataset.meta.num_fields
            nd = self.dataset.meta.num_dense
            sparse = torch.zeros((0, nf), dtype=torch.long, device=dev)
            dense = torch.zeros((0, nd), device=dev) if nd else None
            return sparse, dense, torch.zeros((0, 1), device=dev)
        sparse = torch.from_numpy(batch.sparse).to(dev)
        dense = None if batch.dense is None else torch.from_numpy(batch.dense).to(dev)
        return sparse, dense, torch.from_numpy(batch.labels).to(dev)

    def step(self, batch: Batch | None, global_batch: int) -> tuple[float, float, int]:
        """One global step on this rank's ``batch`` (None: nothing left). Returns this rank's
        (loss sum, correct predictions, samples)."""
        self.model.train()
        sparse, dense, labels = self._tensors(batch)
        with torch.autocast(self.env.device.type, dtype=torch.bfloat16, enabled=self.cfg.amp):
            logits = self.model(sparse, dense)
        logits = logits.float()
        loss_sum = self.loss_fn(logits, labels)
        (loss_sum / max(1, global_batch)).backward()
        sum_dense_grads(self.env, self.dense_params)
        self.dense_opt.step()
        self.dense_opt.zero_grad(set_to_none=False)
        with torch.no_grad():
            correct = float(((logits > 0).float() == labels).sum())
        return float(loss_sum.detach()), correct, int(labels.shape[0])

    # ---- checkpoint / resume ---------------------------------------------------------------
    def checkpoint(self) -> None:
        """Flush the table and write a checkpoint at the current position (collective)."""
        assert self.cfg.checkpoint_dir is not None
        self.model.embedding.flush()
        dense = {"model": self.model.dense_state_dict(), "optimizer": self.dense_opt.state_dict()}
        path = save_checkpoint(
            self.cfg.checkpoint_dir,
            self.env,
            position=self.position,
            dense_state=dense,
            embedding_state=self.model.embedding.state_dict(),
            info={**self.info, "config": to_dict(self.cfg)},
        )
        self.log.info(f"checkpoint {path}", step=self.position.step)

    def restore(self, ck: LoadedCheckpoint) -> None:
        """Load a verified checkpoint: rows, dense state, optimizer states, position, RNG."""
        check_compatible(ck, self.info_for_compat())
        self.model.embedding.load_state_dict(ck.embedding_union())
        dense = ck.dense()
        try:
            self.model.load_dense_state_dict(dense["model"])
            self.dense_opt.load_state_dict(dense["optimizer"])
        except (KeyError, ValueError) as err:
            raise ValueError(f"{ck.path / 'dense.pt'}: does not fit this model ({err})") from err
        pos = ck.position
        if pos.world_size == self.env.world_size:
            rng = ck.rng(self.env.rank)
            if rng is not None:
                set_rng_state(rng)
            self.position = pos
        else:
            # Another worker count: the shards differ, so continue at the same share of the epoch.
            spe_old = int(ck.manifest.get("steps_per_epoch", self.steps_per_epoch))
            batch = round(pos.batch * self.steps_per_epoch / max(1, spe_old))
            self.position = Position(
                pos.step, pos.epoch, min(batch, self.steps_per_epoch), self.env.world_size
            )
            self.log.info(
                f"resuming a {pos.world_size}-rank checkpoint on {self.env.world_size} ranks: "
                f"epoch {pos.epoch}, batch {self.position.batch} of {self.steps_per_epoch}"
            )
        self.log.info(f"resumed from {ck.path} at step {self.position.step}")

    def info_for_compat(self) -> dict[str, Any]:
        keys = ("model", "embed_dim", "table_dim", "num_rows", "dataset_fingerprint")
        return {k: self.info[k] for k in keys if k in self.info}

    # ---- the loop --------------------------------------------------------------------------
    def _due(self, every: int) -> bool:
        return every > 0 and self.position.step % every == 0

    def fit(self) -> dict[str, Any]:
        """Train until ``--iter`` steps or ``--epochs`` epochs; returns the final results."""
        cfg = self.cfg
        self.info["steps_per_epoch"] = self.steps_per_epoch
        self._note_repeats()
        self.log.start_bar(self.total_steps, initial=self.position.step)
        self._counters0 = self._global_counters()
        interval = Interval()
        steps_run = 0
        while self.position.step < self.total_steps:
            pos = self.position
            loader = BatchLoader(
                self.dataset.train,
                cfg.batch_size,
                indices=self.indices,
                shuffle=cfg.shuffle,
                seed=cfg.seed,
                epoch=pos.epoch,
                start_batch=min(pos.batch, self._local_batches()),
            )
            it = iter(loader)
            for b in range(pos.batch, self.steps_per_epoch):
                if self.position.step >= self.total_steps:
                    break
                t0 = time.perf_counter()
                gb = global_batch_sizes(self.counts, cfg.batch_size, b)
                loss, correct, n = self.step(next(it, None), gb)
                if b + 1 == self.steps_per_epoch:  # epoch done: the next step starts the next
                    self.position = Position(
                        self.position.step + 1, pos.epoch + 1, 0, self.env.world_size
                    )
                else:
                    self.position = Position(
                        self.position.step + 1, pos.epoch, b + 1, self.env.world_size
                    )
                dt = time.perf_counter() - t0
                self._account(steps_run, dt, gb)
                steps_run += 1
                self.samples_seen += gb
                interval.loss_sum += loss
                interval.correct += correct
                interval.samples += n
                interval.global_samples += gb
                interval.seconds += dt
                interval.steps += 1
                interval.epoch = pos.epoch
                self.log.advance()
                if self._due(cfg.log_every):
                    self._log_train(interval)
                    interval = Interval()
                if cfg.val and self._due(cfg.eval_every):
                    self.run_eval()
                if cfg.checkpoint_dir is not None and self._due(cfg.checkpoint_every):
                    self.checkpoint()
        if interval.steps:
            self._log_train(interval)
        self.model.embedding.flush()
        if cfg.val and (self.last_eval is None or self.last_eval_step != self.position.step):
            self.run_eval()
        if cfg.checkpoint_dir is not None and not self._due(cfg.checkpoint_every):
            self.checkpoint()
        return self.results()

    def _note_repeats(self) -> None:
        """Say so when ``--iter`` runs past the first epoch: from then on every rank trains on
        samples it has already trained on, so TRAIN loss (measured on each batch before its
        update) falls below what EVAL measures on unseen samples, and runs of different world
        sizes at equal ``--iter`` are no longer comparable (they see different numbers of
        passes). Found as a 2-GPU run "worse than 1 GPU" that was in its second epoch."""
        if not self.cfg.iter or self.total_steps <= self.steps_per_epoch:
            return
        self.log.info(
            f"note: --iter {self.cfg.iter} is {self.total_steps / self.steps_per_epoch:.2f} "
            f"epochs of the training split ({self.steps_per_epoch} global steps each, "
            f"{sum(self.counts)} samples): from step {self.steps_per_epoch + 1} on samples "
            f"repeat, so TRAIN loss is on already-seen samples (TRAIN lines show the epoch)",
            steps_per_epoch=self.steps_per_epoch,
        )

    def _local_batches(self) -> int:
        return math.ceil(self.indices.size / self.cfg.batch_size)

    def _account(self, steps_run: int, seconds: float, global_samples: int) -> None:
        key = "warmup" if steps_run < self.cfg.warmup_steps else "steady"
        self._timing[f"{key}_s"] += seconds
        self._timing[f"{key}_samples"] += global_samples

    def _global_counters(self) -> dict[str, float]:
        counters = getattr(self.model.embedding, "counters", None)
        local = counters() if callable(counters) else {}
        keys = sorted(local)
        if not keys:
            return {}
        vec = torch.tensor([float(local[k]) for k in keys], dtype=torch.float64)
        vec = all_reduce_sum(self.env, vec)
        return dict(zip(keys, vec.tolist(), strict=True))

    def _log_train(self, iv: Interval) -> None:
        vec = torch.tensor(
            [iv.loss_sum, iv.correct, float(iv.samples), iv.seconds], dtype=torch.float64
        )
        vec = all_reduce_sum(self.env, vec)
        loss_sum, correct, samples, secs = vec.tolist()
        seconds = secs / self.env.world_size  # ranks run in lockstep; average their clocks
        now = self._global_counters()
        delta = {k: now[k] - self._counters0.get(k, 0.0) for k in now}
        self._counters0 = now
        fields: dict[str, Any] = {
            "loss": loss_sum / max(1.0, samples),
            "acc": correct / max(1.0, samples),
            "time": seconds,
            "speed": iv.global_samples / seconds if seconds > 0 else 0.0,
        }
        fields.update(summarize_counters(delta, iv.global_samples))
        fields["epoch"] = iv.epoch
        self.log.metrics("TRAIN", self.position.step, fields)

    def run_eval(self) -> EvalResult:
        """Flush pending updates and evaluate on the whole test split (collective)."""
        self.model.embedding.flush()
        before = self._local_counters()
        res = evaluate(
            self.model,
            self.dataset.test,
            self.env,
            batch_size=self.cfg.eval_batch_size,
            amp=self.cfg.amp,
        )
        for k, v in self._local_counters().items():
            self._eval_counters[k] = self._eval_counters.get(k, 0.0) + v - before.get(k, 0.0)
        self.last_eval = res
        self.last_eval_step = self.position.step
        self.log.metrics(
            "EVAL", self.position.step, {**res.fields(), "samples_seen": self.samples_seen}
        )
        return res

    def _local_counters(self) -> dict[str, float]:
        counters = getattr(self.model.embedding, "counters", None)
        return {k: float(v) for k, v in counters().items()} if callable(counters) else {}

    def _memory(self) -> dict[str, Any]:
        """Stored rows (owned + mirrors) and peak RSS per rank, max and mean over ranks."""
        emb = self.model.embedding
        own = int(getattr(emb, "n_own", 0))
        mir = int(getattr(emb, "n_mir", 0))
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB
        ranks = all_gather_object(self.env, (own, mir, rss_mb))
        out: dict[str, Any] = {}
        for i, name in enumerate(("owned_rows", "mirror_rows", "peak_rss_mb")):
            vals = [float(r[i]) for r in ranks]
            out[f"{name}_max"] = max(vals)
            out[f"{name}_mean"] = sum(vals) / len(vals)
        stored = [float(r[0] + r[1]) for r in ranks]
        out["stored_rows_max"] = max(stored)
        out["stored_rows_mean"] = sum(stored) / len(stored)
        return out

    def results(self) -> dict[str, Any]:
        t = self._timing
        out: dict[str, Any] = {
            "step": self.position.step,
            "epoch": self.position.epoch,
            "world_size": self.env.world_size,
            "speed": t["steady_samples"] / t["steady_s"] if t["steady_s"] > 0 else None,
            "warmup_speed": t["warmup_samples"] / t["warmup_s"] if t["warmup_s"] > 0 else None,
            "warmup_steps": self.cfg.warmup_steps,
            "train_seconds": t["warmup_s"] + t["steady_s"],
        }
        if self.last_eval is not None:
            out.update(self.last_eval.fields())
        total = self._global_counters()
        out["embedding"] = summarize_counters(total, None)
        out["embedding_counters"] = total
        # Training only (evaluation's lookups excluded), for bytes per training sample.
        keys = sorted(total)
        if keys:
            ev = torch.tensor([self._eval_counters.get(k, 0.0) for k in keys], dtype=torch.float64)
            ev = all_reduce_sum(self.env, ev).tolist()
            train = {k: total[k] - e for k, e in zip(keys, ev, strict=True)}
            out["embedding_train_counters"] = train
            out["embedding_train"] = summarize_counters(train, self.samples_seen or None)
        out["samples_seen"] = self.samples_seen
        out["memory"] = self._memory()
        return out
