"""hetgmp's Python API: everything a training script needs, importable from ``hetgmp``.

::

    import hetgmp

    with hetgmp.distributed() as env:                   # mpirun, torchrun or one process
        ds = hetgmp.open_dataset("data/criteo")         # or hetgmp.generate_dataset(...)
        plan = hetgmp.make_plan(ds, env=env, out="data/criteo/part-2.npz")  # or load_plan
        model = hetgmp.build_model(ds, env, plan, embed_dim=16, store_rate=0.1)
        trainer = hetgmp.Trainer(model, ds, env, batch_size=1024, epochs=1)
        results = trainer.fit()                         # results["val_auc"]: exact AUC
        trainer.save("checkpoints")                     # restore: trainer.load("checkpoints")

The rules of the distributed table (docs/python_api.md has the walkthrough):

1. **Every rank calls forward every step**, with an empty batch once it runs out of data: each
   step meets every other rank in the table's exchanges (evaluation and flush too).
2. **Forward applies the previous step's update**: ``backward`` only captures the rows'
   gradient; the owners apply it during the next forward (or a flush).
3. **``state_dict`` is collective**: it flushes first, so every rank calls it at the same point.
4. **The loss is scaled by the global batch** (sum over this rank's samples / samples of the
   step over all ranks), so N ranks train like one process on the global batch.

:class:`Trainer` follows all four; they matter when you write your own loop
(:meth:`Trainer.step`, :meth:`Trainer.batches`) or call the table directly. Every function here
that takes ``env`` is collective: every rank calls it, in the same order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from hetgmp.comm.env import DistEnv
from hetgmp.comm.launch import abort_job, init_distributed, shutdown
from hetgmp.config import validate
from hetgmp.data.format import Dataset, open_dataset
from hetgmp.data.generate import generate_criteo_like
from hetgmp.data.id_ranges import check_id_ranges
from hetgmp.embedding import DistributedEmbedding
from hetgmp.models import CTRModel
from hetgmp.partition.api import partition_dataset
from hetgmp.partition.plan import Plan, save_plan
from hetgmp.partition.plan import load_plan as _load_plan
from hetgmp.train.config import TrainConfig
from hetgmp.train.evaluate import EvalResult
from hetgmp.train.facade import BUILD_ATTR, BuildRecord, Trainer, check_types
from hetgmp.train.multi_hot import pooling_option
from hetgmp.train.multi_hot import prepare as prepare_multi_hot
from hetgmp.train.run import build_ctr_model, check_plan, fallback_plan
from hetgmp.train.run import on_rank0_then_all as _on_rank0_then_all
from hetgmp.train.threads import apply_threads

__all__ = [
    "Dataset", "DistEnv", "DistributedEmbedding", "EvalResult", "Plan", "Trainer",
    "build_model", "distributed", "generate_dataset", "init", "load_plan", "on_rank0",
    "make_plan", "open_dataset", "save_plan", "shutdown",
]  # fmt: skip

T = TypeVar("T")

# build_model's keyword options: the model and its table (TrainConfig fields, CLI defaults).
MODEL_OPTIONS = (
    "model", "embed_dim", "optimizer", "lr", "bound", "store_rate", "seed", "init_scale",
    "adagrad_init", "kernels", "replies", "exchange", "pooling",
)  # fmt: skip


def init(
    *, backend: str = "auto", device: str = "auto", timeout_s: float = 300.0, threads: int = 0
) -> DistEnv:
    """Join the job this process was launched in: ``mpirun`` / ``torchrun`` (their environment
    variables) or a single plain process (no process group). gloo on CPU, NCCL on CUDA;
    ``timeout_s`` bounds every collective; ``threads``: torch CPU threads (0: the cores shared
    among the host's ranks). Pair with :func:`shutdown`, or use :func:`distributed`."""
    env = init_distributed(backend=backend, device=device, timeout_s=timeout_s)
    apply_threads(env, threads)
    return env


@contextlib.contextmanager
def distributed(
    *, backend: str = "auto", device: str = "auto", timeout_s: float = 300.0, threads: int = 0
) -> Iterator[DistEnv]:
    """:func:`init` ... :func:`shutdown` as a ``with`` block. On an error under ``mpirun`` it
    ends the whole job (``MPI_Abort``), so a peer blocked in a collective does not hang it."""
    env = init(backend=backend, device=device, timeout_s=timeout_s, threads=threads)
    finished = False
    try:
        yield env
        finished = True
    except Exception as err:
        abort_job(env, err)
        raise
    finally:
        shutdown(env, wait_for_peers=finished)


def on_rank0(env: DistEnv | None, fn: Callable[[], T]) -> T | None:
    """Run ``fn()`` on rank 0 only (e.g. write a file the others then read); rank 0 gets its
    result, the others None, and if it fails every rank raises the error, so none waits forever
    (collective: the others wait for rank 0)."""
    if env is None:
        return fn()
    return _on_rank0_then_all(env, fn)


def generate_dataset(
    out: str | os.PathLike[str],
    *,
    env: DistEnv | None = None,
    num_samples: int = 20_000,
    scale: float = 0.001,
    seed: int = 0,
    **options: Any,
) -> Dataset:
    """A synthetic Criteo-like data set at ``out`` (26 categorical fields, 13 dense ones, labels
    from a planted model), generated by rank 0 if ``out`` holds none yet; an existing one is
    opened as it is. ``options``: those of :func:`hetgmp.data.generate.generate_criteo_like`
    (``locality``, ``test_fraction``, ``positive_rate`` ...)."""
    path = Path(out)

    def make() -> None:
        if not (path / "meta.json").exists():
            options.setdefault("progress", False)
            generate_criteo_like(path, num_samples=num_samples, scale=scale, seed=seed, **options)

    on_rank0(env, make)
    return open_dataset(path)


def make_plan(
    dataset: Dataset,
    nparts: int | None = None,
    *,
    env: DistEnv | None = None,
    out: str | os.PathLike[str] | None = None,
    method: str = "metis+refine",
    seed: int = 0,
    progress: bool = False,
    **options: Any,
) -> Plan:
    """Place ``dataset``'s training samples and rows on ``nparts`` workers (default: the
    ranks of ``env``) and rank each worker's mirrors; see :mod:`hetgmp.partition.api` for the
    methods and ``options`` (``batch_size``, ``rounds``, ``gpus_per_node`` ...).

    With ``env`` of several ranks, rank 0 partitions and writes the plan to ``out`` (required
    then), the others read it (collective). ``out`` given: the plan is saved there."""
    parts = nparts if nparts is not None else (env.world_size if env is not None else 1)
    if env is not None and env.world_size > 1 and out is None:
        raise ValueError("partition on several ranks: give out=, the file rank 0 writes")

    def make() -> Plan:
        plan = partition_dataset(
            dataset, parts, method=method, seed=seed, progress=progress, **options
        )
        if out is not None:
            save_plan(plan, out)
        return plan

    if env is None or env.world_size == 1:
        return make()

    def write() -> None:  # (the plan travels as a file, not pickled to every rank)
        make()

    on_rank0(env, write)
    assert out is not None
    return _load_plan(out)


def load_plan(
    path: str | os.PathLike[str], dataset: Dataset | None = None, env: DistEnv | None = None
) -> Plan:
    """Read a plan file (``hetgmp partition``'s ``part.npz``); given ``dataset`` / ``env``, it
    is refused (:class:`~hetgmp.partition.plan.PlanError`) when made for other data or another
    number of ranks."""
    plan = _load_plan(path)
    if dataset is not None and env is not None:
        check_plan(plan, dataset, env, where=str(path))
    return plan


def build_model(
    dataset: Dataset, env: DistEnv, plan: Plan | None = None, **options: Any
) -> CTRModel:
    """A CTR model (``model``: wdl, dcn, dfm, dlrm) around a
    :class:`~hetgmp.embedding.DistributedEmbedding` of ``dataset``'s rows, placed by ``plan``
    (none: rows hashed to ranks; with ``store_rate`` > 0 on several ranks, HET-GMP's fallback:
    random owners, each rank mirroring the rows its own samples use most). Collective.

    Options, with ``hetgmp train``'s defaults: ``model`` ("wdl"), ``embed_dim`` (16; or one
    per field, single-hot fields then multi-hot ones: ``(16, 8, ...)`` or ``"16,8,..."``), the
    table's optimizer ``optimizer`` ("adagrad", or "sgd") and ``lr`` (0.05), ``bound`` (the
    staleness bound, 0), ``store_rate`` (share of all rows each rank mirrors, 0), ``seed`` (0;
    the dense layers are seeded with it, identically on every rank), ``init_scale``,
    ``adagrad_init``, ``kernels``, ``replies``, ``exchange``. The model's ``.embedding`` is the
    table; see its ``forward`` and ``state_dict`` for the rules of calling it yourself.

    Multi-hot fields (lists of ids: histories, tags; on CPU and on one GPU, as ``hetgmp
    train``): ``pooling`` ("sum"; or "mean", or one mode per multi-hot field: ``("sum",
    "mean")`` or ``"sum,mean"``) says how each bag of rows becomes one; the bags are padded into
    the ids as the CLI does, and an ``env`` of several CUDA ranks is refused, naming issue 34."""
    unknown = sorted(set(options) - set(MODEL_OPTIONS))
    if unknown:
        raise TypeError(f"build_model: unknown option(s) {unknown}; known: {list(MODEL_OPTIONS)}")
    if "pooling" in options:  # (a sequence of modes -> --pooling's text, checked)
        options = {**options, "pooling": pooling_option(options["pooling"])}
    # (embed_dim: one int, or one per field as a sequence or "16,8,...", checked by TrainConfig)
    per_field = isinstance(options.get("embed_dim"), (str, Sequence))
    check_types({k: v for k, v in options.items() if k != "embed_dim" or not per_field})
    cfg = validate(dataclasses.replace(TrainConfig(), dataset=str(dataset.root), **options))
    ds = prepare_multi_hot(cfg, env, dataset, api=True)  # (refuses what it does not do yet)
    if ds is not dataset:  # (a bad id in a bag: refused now, by file, as the CLI does)
        check_id_ranges(dataset, dataset.meta.num_embeddings, multi_hot_ok=True)
    if plan is None and cfg.store_rate > 0 and env.world_size > 1:
        plan = fallback_plan(ds, env, cfg.seed)
    elif plan is not None:
        check_plan(plan, ds, env, where=str(plan.meta.get("path", "plan")))
    model = build_ctr_model(cfg, env, ds, plan)
    # (read by Trainer: the options, the plan and the data set as the model reads it)
    setattr(model, BUILD_ATTR, BuildRecord(cfg, plan, ds))
    return model
