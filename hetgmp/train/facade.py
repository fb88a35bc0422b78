"""The public :class:`Trainer`: the CLI's training loop behind keyword arguments.

It wraps :class:`hetgmp.train.trainer.Trainer` (the loop ``hetgmp train`` runs) and builds the
:class:`~hetgmp.train.config.TrainConfig` and :class:`~hetgmp.train.runlog.RunLog` that loop
needs from a few keyword arguments, so a script never sees either. Same seed, data and options
give the same result as the command line (tests/test_python_api.py checks it).
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from hetgmp.comm.collectives import all_reduce_sum
from hetgmp.comm.env import DistEnv
from hetgmp.config import to_dict, validate
from hetgmp.data.format import Dataset
from hetgmp.data.loader import Batch, BatchLoader, rank_sample_indices
from hetgmp.models import MODELS, CTRModel
from hetgmp.partition.plan import Plan
from hetgmp.train.checkpoint import open_checkpoint
from hetgmp.train.config import TrainConfig
from hetgmp.train.evaluate import EvalResult, gather_rows, score_split
from hetgmp.train.multi_hot import matching
from hetgmp.train.resume import save_trainer
from hetgmp.train.run import run_info
from hetgmp.train.runlog import RunLog
from hetgmp.train.step import table
from hetgmp.train.trainer import Trainer as LoopTrainer
from hetgmp.train.warm_start import warm_start

# What the model was built with (set by hetgmp.api.build_model): its options and plan.
BUILD_ATTR = "_hetgmp_build"

# The training options a Trainer takes, as TrainConfig fields (the table's own options --
# optimizer, lr, bound, store_rate ... -- belong to build_model).
TRAINER_OPTIONS = (
    "batch_size", "epochs", "iter", "dense_optimizer", "dense_lr", "shuffle", "seed", "val",
    "log_every", "eval_every", "eval_batch_size", "checkpoint_dir", "checkpoint_every",
    "keep_checkpoints", "amp", "warmup_steps", "data_on_device", "device_data_budget_gb",
    "prefetch_batches", "profile_steps", "log_json",
)  # fmt: skip
ALIASES = {"iters": "iter", "evaluate": "val"}


@dataclasses.dataclass(frozen=True)
class BuildRecord:
    """How :func:`hetgmp.api.build_model` made a model: its resolved options, its plan and the
    data set as the model reads it (multi-hot fields: their bags padded into the ids)."""

    config: TrainConfig
    plan: Plan | None
    dataset: Dataset | None = None


def check_types(options: dict[str, Any]) -> None:
    """Refuse an option of the wrong type (``batch_size="64"``) here, naming it, rather than
    deep inside a comparison later. Names are TrainConfig fields."""
    hints = typing.get_type_hints(TrainConfig)
    for name, value in options.items():
        allowed = typing.get_args(hints[name]) or (hints[name],)
        if value is None and type(None) in allowed:
            continue
        ok = any(_fits(value, tp) for tp in allowed if tp is not type(None))
        if not ok:
            want = " or ".join(getattr(t, "__name__", str(t)) for t in allowed)
            raise TypeError(f"{name}: expected {want}, got {type(value).__name__} {value!r}")


def _fits(value: Any, tp: Any) -> bool:
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is Path:
        return isinstance(value, (str, os.PathLike))
    return isinstance(value, tp)


def _model_name(model: CTRModel) -> str:
    for name, cls in MODELS.items():
        if type(model) is cls:
            return name
    raise TypeError(f"Trainer: {type(model).__name__} is not one of the models {sorted(MODELS)}")


def trainer_config(model: CTRModel, dataset: Dataset, options: dict[str, Any]) -> TrainConfig:
    """The loop's TrainConfig: the model's build options plus the Trainer's ``options``
    (unknown names refused with the list of known ones)."""
    fields: dict[str, Any] = {}
    for key, value in options.items():
        name = ALIASES.get(key, key)
        if name not in TRAINER_OPTIONS:
            known = ", ".join(sorted({*TRAINER_OPTIONS, *ALIASES}))
            raise TypeError(f"Trainer: unknown option {key!r}; known: {known}")
        fields[name] = value
    check_types(fields)
    for name in ("checkpoint_dir", "log_json"):
        if fields.get(name) is not None:
            fields[name] = Path(fields[name])
    built: BuildRecord | None = getattr(model, BUILD_ATTR, None)
    if built is not None:
        base = built.config
    else:  # a model built by hand: only its shape is known
        base = TrainConfig(model=_model_name(model), embed_dim=model.embed_dim)
    cfg = dataclasses.replace(base, dataset=str(dataset.root), progress=False, **fields)
    return validate(cfg)


class Trainer:
    """Train a model with the distributed table on this rank's share of a data set.

    ``model``: from :func:`hetgmp.api.build_model` (or any of :mod:`hetgmp.models` around a
    :class:`~hetgmp.embedding.DistributedEmbedding`); ``plan``: the plan the model was built
    with (taken from the model when :func:`~hetgmp.api.build_model` made it); it also decides
    which samples this rank trains on (none: contiguous shards). Options (defaults as
    ``hetgmp train``): ``batch_size`` (per rank), ``epochs``, ``iters`` (global steps, 0: use
    ``epochs``), ``dense_optimizer`` / ``dense_lr``, ``seed`` (shuffling; default the model's),
    ``shuffle``, ``log_every``, ``eval_every``, ``evaluate`` (at the end of :meth:`fit`),
    ``eval_batch_size``, ``checkpoint_dir`` / ``checkpoint_every`` / ``keep_checkpoints``,
    ``amp``, ``log_json`` and the data pipeline's ``data_on_device``, ``prefetch_batches``.
    ``verbose``: rank 0 prints TRAIN / EVAL lines to ``stream`` (default stdout).

    Rules (docs/python_api.md): every call here is **collective** -- every rank makes the same
    calls in the same order; a step's loss is the sum over this rank's samples divided by the
    **global** batch; the rows' update of a step is applied during the next one.
    """

    def __init__(
        self,
        model: CTRModel,
        dataset: Dataset,
        env: DistEnv,
        *,
        plan: Plan | None = None,
        verbose: bool = True,
        stream: TextIO | None = None,
        **options: Any,
    ) -> None:
        self._config = trainer_config(model, dataset, options)
        built: BuildRecord | None = getattr(model, BUILD_ATTR, None)
        if plan is None and built is not None:
            plan = built.plan
        cfg = self._config
        # (multi-hot fields: the padded data set the model was built on, or this one padded)
        dataset = matching(cfg, env, dataset, built.dataset if built else None, model.bags)
        self.env, self.dataset, self.plan = env, dataset, plan
        self._log = RunLog(
            active=env.is_main and verbose, json_path=cfg.log_json, progress=False, stream=stream
        )

        def indices_of(rank: int) -> np.ndarray:
            return rank_sample_indices(len(dataset.train), rank, env.world_size, plan)

        info = run_info(cfg, dataset, None)
        self._loop = LoopTrainer(
            cfg, env, dataset, model, self._log, indices=indices_of(env.rank),
            indices_of=indices_of, info=info,
        )  # fmt: skip

    @property
    def model(self) -> CTRModel:
        return self._loop.model

    @property
    def global_step(self) -> int:
        """Global steps trained so far (restored ones included)."""
        return self._loop.position.step

    @property
    def steps_per_epoch(self) -> int:
        """Global steps in one epoch: the most batches any rank has."""
        return self._loop.steps_per_epoch

    def options(self) -> dict[str, Any]:
        """Every resolved option of this run (what checkpoints record)."""
        return to_dict(self._config)

    def fit(self) -> dict[str, Any]:
        """Train to ``iters`` global steps (or ``epochs`` epochs), from the restored position
        if :meth:`load` was called; evaluate at the end (unless ``evaluate=False``) and write
        a checkpoint when ``checkpoint_dir`` is set. Returns the results, the same on every
        rank: ``val_auc`` / ``val_loss`` / ``val_acc``, ``step``, ``samples_seen``, ``speed``,
        ``embedding`` (traffic and mirror counters) ...

        Collective. Inside, every rank runs every global step -- a rank out of samples runs
        it on an empty batch, because the table needs every rank at every exchange; each
        step's loss is ``sum of losses on this rank / global batch``, and the dense gradients
        are summed over ranks, so N ranks train like one process on the global batch."""
        return self._loop.fit()

    def batches(self, epoch: int = 0) -> Iterator[Batch | None]:
        """This rank's batches of one epoch for a loop of your own, then ``None`` until every
        rank has had :attr:`steps_per_epoch` of them: pass each to :meth:`step`."""
        cfg = self._config
        loader = BatchLoader(
            self.dataset.train, cfg.batch_size, indices=self._loop.indices,
            shuffle=cfg.shuffle, seed=cfg.seed, epoch=epoch,
        )  # fmt: skip
        yield from loader
        for _ in range(self.steps_per_epoch - len(loader)):
            yield None

    def step(
        self, batch: Batch | None, global_batch: int | None = None
    ) -> tuple[float, float, int]:
        """One global step on this rank's ``batch``; returns this rank's (loss sum, correct
        predictions, samples). For loops of your own; :meth:`fit` is the fast path.

        Collective, with four rules: **every rank calls it every step**, passing ``None``
        (an empty batch) once out of data; the table **applies the previous step's row
        update** during this step's forward (so read rows after :meth:`evaluate` or
        :meth:`save`, which flush); the loss is **scaled by the global batch**
        ``global_batch`` (the step's samples over all ranks; ``None``: summed here, one more
        collective); dense gradients are summed over ranks. Steps taken here do not move
        :attr:`global_step` (checkpoints record :meth:`fit`'s position)."""
        n = 0 if batch is None else len(batch)
        if global_batch is None:
            global_batch = int(all_reduce_sum(self.env, n))
        return self._loop.step(batch, global_batch)

    def evaluate(self) -> EvalResult:
        """Exact logloss / accuracy / AUC on the whole test split (collective: it flushes the
        table's pending updates, every rank scores a shard, the scores are gathered once; the
        same numbers for any rank count)."""
        return self._loop.run_eval()

    def predict(self, split: str = "test") -> np.ndarray:
        """The model's click probabilities for every sample of ``split`` ("test" or "train"),
        in the split's stored order: float32 ``[N]``, the same array on every rank.

        Collective, as :meth:`evaluate`: pending row updates are applied first, every rank
        scores a contiguous shard, and the shards are gathered once."""
        if split not in ("train", "test"):
            raise ValueError(f"Trainer.predict: split {split!r}: expected 'train' or 'test'")
        loop = self._loop
        loop.train_step.average_dense()
        table(loop.model).flush()
        probs, _ = score_split(
            loop.model, self.dataset.split(split), self.env,
            batch_size=self._config.eval_batch_size, amp=loop.amp,
        )  # fmt: skip
        return gather_rows(self.env, probs.reshape(1, -1))[0].cpu().numpy()

    def save(self, directory: str | Path | None = None) -> Path:
        """Write a checkpoint under ``directory`` (default ``checkpoint_dir``); returns it.

        Collective: the table's ``state_dict`` flushes pending updates first, and every rank
        writes the rows it owns. It loads under any rank count or plan (:meth:`load`)."""
        root = Path(directory) if directory is not None else self._config.checkpoint_dir
        if root is None:
            raise ValueError("Trainer.save: give a directory (or checkpoint_dir= to the Trainer)")
        return save_trainer(self._loop, root)

    def load(self, path: str | Path) -> None:
        """Restore a checkpoint (a directory from :meth:`save`, or its parent: the latest):
        rows, dense parameters, optimizer states and the position :meth:`fit` resumes from.
        Collective; refused when made for another model shape or data set."""
        self._loop.restore(open_checkpoint(Path(path), verify=self.env.is_main))

    def init_from(self, path: str | Path) -> None:
        """Start from a checkpoint's rows, dense weights and optimizer states (``--init-from``:
        yesterday's model on today's data, encoded with its vocabulary, grown or not); the
        position stays at step 0 and this trainer's options (learning rates included) apply.
        Any rank count or plan; refused, saying what differs, when shapes differ.
        Collective."""
        warm_start(self._loop, open_checkpoint(Path(path), verify=self.env.is_main))

    def close(self) -> None:
        """Close the JSON log (``log_json``), if any."""
        self._log.close()
