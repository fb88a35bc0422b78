"""Set up and run one training job from a :class:`TrainConfig` (what the CLIs call).

``run(cfg)`` joins the process group (mpirun / torchrun / single process), then :func:`train`
opens the data set (generating the default one on first use), checks the plan, builds the
distributed embedding and the model, restores a checkpoint when asked, trains and evaluates.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hetgmp.comm.collectives import all_gather_object
from hetgmp.comm.env import DistEnv
from hetgmp.comm.launch import abort_job, init_distributed, shutdown
from hetgmp.config import to_dict
from hetgmp.data.defaults import default_dataset_dir, ensure_default_dataset
from hetgmp.data.format import Dataset, DatasetError, open_dataset
from hetgmp.data.id_ranges import check_id_ranges
from hetgmp.data.loader import rank_sample_indices
from hetgmp.filecheck import sha256
from hetgmp.models import CTRModel, build_model, model_class
from hetgmp.partition.plan import Plan, load_plan
from hetgmp.train.checkpoint import CheckpointError, find_checkpoint, open_checkpoint
from hetgmp.train.config import DEFAULT_DATASET, TrainConfig
from hetgmp.train.config_checks import dims_of_fields
from hetgmp.train.memory_plan import memory_plan
from hetgmp.train.multi_hot import bag_layout, multi_hot_note
from hetgmp.train.multi_hot import prepare as prepare_multi_hot
from hetgmp.train.runlog import RunLog
from hetgmp.train.summary import summary_lines
from hetgmp.train.threads import set_threads
from hetgmp.train.tier_exchange import exchange_of
from hetgmp.train.tier_warm import warm_counts
from hetgmp.train.trainer import Trainer
from hetgmp.train.warm_start import layout_of, warm_start

EmbeddingFactory = Callable[[TrainConfig, DistEnv, int, int, Plan | None], nn.Module]


class TrainError(RuntimeError):
    """A rank failed during setup; every rank raises it so none waits for the others."""


def on_rank0_then_all(env: DistEnv, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on rank 0 only; every rank gets its result or raises its error (collective)."""
    result: Any = None
    error = ""
    if env.is_main:
        try:
            result = fn()
        except (ValueError, RuntimeError, OSError) as err:
            error = str(err)
    results = all_gather_object(env, error)
    if results[0]:
        raise TrainError(f"rank 0 failed: {results[0]}")
    return result


def resolve_dataset(cfg: TrainConfig, env: DistEnv, log: RunLog) -> Dataset:
    """``--dataset``: a directory, or a prepared name under ``--cache-dir/datasets``; the
    default name is generated there on first use (by rank 0, the others wait)."""
    path = Path(cfg.dataset)
    if path.is_dir():
        return open_dataset(path)
    named = cfg.cache_dir / "datasets" / cfg.dataset
    if named.is_dir():
        return open_dataset(named)
    if cfg.dataset != DEFAULT_DATASET:
        raise DatasetError(
            f"--dataset {cfg.dataset}: neither a directory nor a prepared data set under "
            f"{cfg.cache_dir / 'datasets'} (make one with `hetgmp preprocess` from raw click "
            "logs, or `hetgmp generate`; leave --dataset out for the generated default)"
        )

    # The same cached set `hetgmp partition` uses without --data, so default plans fit it.
    default_dir = default_dataset_dir(cfg.cache_dir, cfg.default_samples)

    def generate() -> None:
        if not (default_dir / "meta.json").exists():
            log.info(
                f"generating the default data set ({cfg.default_samples} samples) into {default_dir}"
            )
        ensure_default_dataset(
            cfg.cache_dir, cfg.default_samples, progress=cfg.progress is not False
        )

    on_rank0_then_all(env, generate)
    return open_dataset(default_dir)


def plan_fingerprint(path: Path) -> str:
    return sha256(path)


def load_checked_plan(cfg: TrainConfig, env: DistEnv, ds: Dataset, log: RunLog) -> Plan | None:
    """The ``--partition`` plan, refused when made for other data or another rank count; none
    given but mirrors asked for: one made here (random owners, mirrors by local frequency)."""
    if cfg.partition is None and cfg.store_rate > 0 and env.world_size > 1:
        log.info(
            f"no --partition given but --store_rate {cfg.store_rate}: random row owners, "
            "contiguous sample shards, each rank mirrors the rows its own samples use most "
            "(as HET-GMP without a partition; `hetgmp partition` makes a better plan)"
        )
        return fallback_plan(ds, env, cfg.seed)
    if cfg.partition is None:
        why = " (one rank owns every row: --store_rate has nothing to mirror)" * (
            cfg.store_rate > 0
        )
        log.info(f"no --partition given: hash placement of rows, contiguous sample shards{why}")
        return None
    plan = load_plan(cfg.partition)
    check_plan(plan, ds, env, where=str(cfg.partition))
    log.info(f"plan {cfg.partition}: {plan.nparts} parts, method {plan.meta.get('method', '?')}")
    return plan


def fallback_plan(ds: Dataset, env: DistEnv, seed: int) -> Plan:
    """HET-GMP's placement without a plan: random row owners, contiguous sample shards, and
    each rank's mirrors ranked by how often its own samples use them."""
    from hetgmp.partition.fallback import local_frequency_plan

    idx = rank_sample_indices(len(ds.train), env.rank, env.world_size, None)
    return local_frequency_plan(
        ds.train.sparse, idx, ds.meta.num_embeddings, env.world_size, env.rank, seed
    )


def check_plan(plan: Plan, ds: Dataset, env: DistEnv, *, where: str) -> None:
    """Refuse a plan made for other data or another rank count (PlanError naming ``where``)."""
    plan.check_matches(
        num_samples=ds.meta.splits.get("train", len(ds.train)),
        num_rows=ds.meta.num_embeddings,
        fingerprint=ds.fingerprint or None,
        world_size=env.world_size,
        where=where,
    )


def distributed_embedding(
    cfg: TrainConfig, env: DistEnv, num_rows: int, dim: int, plan: Plan | None,
    row_counts: np.ndarray | None = None, log: RunLog | None = None,
) -> nn.Module:  # fmt: skip
    """The default table: :class:`hetgmp.embedding.DistributedEmbedding` (``row_counts``: the
    host tier's per-row frequencies, :mod:`hetgmp.train.tier_warm`; ``log``: where the host
    tier's start-up phases are reported)."""
    from hetgmp.embedding import DistributedEmbedding

    return DistributedEmbedding(
        num_rows,
        dim,
        env,
        plan,
        placement="hash",  # used only without a plan
        store_rate=cfg.store_rate if plan is not None else 0.0,  # (mirrors need a plan)
        bound=cfg.bound,
        optimizer=cfg.optimizer,
        lr=cfg.lr,
        init_scale=cfg.init_scale,
        adagrad_init=cfg.adagrad_init,
        seed=cfg.seed,
        kernels=cfg.kernels,
        replies=cfg.replies,
        exchange=exchange_of(cfg, env),
        sync=cfg.sync,
        async_config=async_config(cfg),
        **_host_rows(cfg, row_counts, log),
    )


def _host_rows(
    cfg: TrainConfig, row_counts: np.ndarray | None, log: RunLog | None
) -> dict[str, Any]:
    """``--rows-on host``'s table arguments (none by default: the table's own defaults)."""
    if cfg.rows_on != "host":
        return {}
    counts = None if row_counts is None else torch.from_numpy(row_counts)
    return {"rows_on": "host", "cache_budget": cfg.cache_budget, "cuda_graphs": cfg.cuda_graphs,
            "row_counts": counts, "setup_log": None if log is None else log.info}  # fmt: skip


def async_config(cfg: TrainConfig) -> Any:
    """``--sync async``'s settings for the table (None with ``--sync collective``)."""
    if cfg.sync != "async":
        return None
    from hetgmp.embedding.rowservice import AsyncConfig

    return AsyncConfig(
        max_lag=cfg.max_lag, host=cfg.async_host, port_base=cfg.async_port_base,
        timeout_s=cfg.timeout_s, auth=cfg.async_auth,
    )  # fmt: skip


def build_ctr_model(
    cfg: TrainConfig,
    env: DistEnv,
    ds: Dataset,
    plan: Plan | None,
    *,
    embedding_factory: EmbeddingFactory = distributed_embedding,
    log: RunLog | None = None,
) -> CTRModel:
    """``cfg.model`` around the table ``embedding_factory`` makes for ``ds`` and ``plan``, with
    the dense part seeded by ``cfg.seed`` (identical on every rank). Collective: a distributed
    table meets the other ranks when it is built. The CLI and :mod:`hetgmp.api` both build here."""
    table_dim = model_class(cfg.model).table_dim(cfg.embed_dim)
    torch.manual_seed(cfg.seed)  # identical dense initialisation on every rank
    if embedding_factory is distributed_embedding:  # (the host tier's first residents)
        embedding_factory = functools.partial(
            embedding_factory, row_counts=warm_counts(cfg, ds, log), log=log
        )
    emb = embedding_factory(cfg, env, ds.meta.num_embeddings, table_dim, plan)
    from hetgmp.embedding import DistributedEmbedding

    if log is not None and isinstance(emb, DistributedEmbedding):
        _log_embedding(log, cfg, env, emb)
    bags = bag_layout(cfg, ds, env.device, env.world_size)  # (multi-hot: pooled rows)
    model = build_model(
        cfg.model,
        emb,
        num_fields=bags.num_fields if bags is not None else ds.meta.num_fields,
        num_dense=ds.meta.num_dense,
        embed_dim=cfg.embed_dim,
        field_dims=dims_of_fields(cfg.field_dims, ds.meta),  # (--embed-dim's list, checked)
    )
    model.bags = bags
    if log is not None and bags is not None:
        log.info(f"model: multi-hot pooling kernels {bags.backend} (--kernels {cfg.kernels})")
    dense_kernels = model.use_kernels(cfg.kernels, env.device)  # (DCN's cross network)
    if log is not None and dense_kernels is not None:
        log.info(f"model: {cfg.model} cross kernels {dense_kernels} (--kernels {cfg.kernels})")
    return model


def _log_embedding(log: RunLog, cfg: TrainConfig, env: DistEnv, emb: Any) -> None:
    """The table's resolved settings, and what --sync async's settings mean for this run."""
    sync = emb.sync
    log.info(
        f"embedding: row-update kernels {emb.kernels} (--kernels {cfg.kernels}), "
        f"replies {emb.replies} (--replies {cfg.replies}), exchange "
        f"{emb.exchange} (--exchange {cfg.exchange}), sync {sync}"
        + (f" (--max-lag {cfg.max_lag})" if sync == "async" else "")
    )
    if sync != "async" or env.world_size == 1:
        return
    if cfg.max_lag == 0:
        log.info(
            "async: --max-lag 0 keeps every rank at the same step, so a slow rank still "
            "holds the others up; --max-lag N (e.g. 100) or -1 lets the others run ahead"
        )
    if env.device.type == "cuda":
        log.info(
            "async on GPUs: its step is host work (sockets, Python), lockstep's a few CUDA "
            "graph replays, so on one host with fast links --sync collective is several times "
            "faster even beside a 2x straggler; async pays where lockstep's collectives are "
            "slow or a straggler is worse (docs/architecture.md, 'When async pays')"
        )


def run_info(cfg: TrainConfig, ds: Dataset, plan_path: Path | None) -> dict[str, Any]:
    """The run's identity, recorded in checkpoints and checked when one is restored."""
    return {
        "model": cfg.model,
        "embed_dim": cfg.embed_dim,
        "table_dim": model_class(cfg.model).table_dim(cfg.embed_dim),
        "num_rows": ds.meta.num_embeddings,
        "dataset_fingerprint": ds.fingerprint,
        "plan_fingerprint": plan_fingerprint(plan_path) if plan_path else None,
        "fields": layout_of(ds),  # (how --init-from maps rows onto a grown vocabulary)
        **({"field_dims": list(cfg.field_dims)} if cfg.field_dims else {}),
    }


def build_trainer(
    cfg: TrainConfig, env: DistEnv, log: RunLog, embedding_factory: EmbeddingFactory
) -> Trainer:
    """Open the data set and plan, build the table and the model, wrap them in a trainer."""
    base = resolve_dataset(cfg, env, log)
    ds = prepare_multi_hot(cfg, env, base)  # (refuses what multi-hot training does not do yet)
    # (a bad id, single-hot or in a bag: refused now, by file)
    scanned = check_id_ranges(base, base.meta.num_embeddings, multi_hot_ok=True)
    if scanned:
        log.info(f"data: meta.json records no id ranges for {'/'.join(scanned)}: scanned them")
    if ds is not base:
        log.info(multi_hot_note(cfg, ds))
    plan = load_checked_plan(cfg, env, ds, log)
    model = build_ctr_model(cfg, env, ds, plan, embedding_factory=embedding_factory, log=log)

    def indices_of(rank: int) -> np.ndarray:
        return rank_sample_indices(len(ds.train), rank, env.world_size, plan)

    info = run_info(cfg, ds, cfg.partition)
    return Trainer(
        cfg, env, ds, model, log, indices=indices_of(env.rank), indices_of=indices_of, info=info
    )


def maybe_resume(cfg: TrainConfig, env: DistEnv, trainer: Trainer, log: RunLog) -> None:
    """``--resume``: continue from the latest checkpoint, or start fresh (from ``--init-from``
    when given) when there is none."""
    if cfg.resume:
        assert cfg.checkpoint_dir is not None
        try:
            find_checkpoint(cfg.checkpoint_dir)
        except CheckpointError:
            log.info(f"--resume: no checkpoint in {cfg.checkpoint_dir} yet; starting fresh")
        else:
            trainer.restore(open_checkpoint(cfg.checkpoint_dir, verify=env.is_main))
            return
    if cfg.init_from is not None:
        warm_start(trainer, open_checkpoint(cfg.init_from, verify=env.is_main))


def train(
    cfg: TrainConfig,
    env: DistEnv,
    *,
    embedding_factory: EmbeddingFactory = distributed_embedding,
    stream: Any = None,
) -> dict[str, Any]:
    """Train per ``cfg`` on the already-joined ``env``; returns the results (every rank)."""
    started = time.monotonic()
    log = RunLog(active=env.is_main, json_path=cfg.log_json, progress=cfg.progress, stream=stream)
    try:
        threads = set_threads(cfg, env)
        log.config(to_dict(cfg))
        if threads is not None:
            log.info(threads)
        log.info(
            f"launcher {env.launcher}, {env.world_size} rank(s), device {env.device}, "
            f"backend {env.backend}"
        )
        if cfg.optimizer == "sgd" and cfg.lr < 1.0:
            log.info(
                f"note: --optimizer sgd with --lr {cfg.lr}: rows get the gradient of the "
                "batch-mean loss (about 1/batch of one sample's), so they barely move at this "
                "rate; SGD on rows wants a learning rate around 10, e.g. --lr 10 --dense-lr 0.1 "
                "(bench/sgd_quality/results.md)"
            )
        trainer = build_trainer(cfg, env, log, embedding_factory)
        for line in memory_plan(
            env, trainer.model.embedding, trainer.dataset.train, trainer.indices,
            max(cfg.batch_size, cfg.eval_batch_size),
        ):  # fmt: skip
            log.info(line)
        maybe_resume(cfg, env, trainer, log)
        results = trainer.fit()
        results["config"] = to_dict(cfg)
        log.result({k: v for k, v in results.items() if k not in ("config", "embedding_counters")})
        best = trainer.dataset.meta.best_auc
        log.summary(summary_lines(results, best_auc=best, wall_s=time.monotonic() - started))
        if cfg.output is not None and env.is_main:
            write_results(cfg.output, results)
        return results
    finally:
        log.close()


def write_results(path: Path, results: dict[str, Any]) -> None:
    """Results JSON with the machine, command and date it came from."""
    record = {
        **results,
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus",
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def run(cfg: TrainConfig) -> dict[str, Any]:
    """Join the process group the launcher set up, train, leave."""
    env = init_distributed(backend=cfg.backend, device=cfg.device, timeout_s=cfg.timeout_s)
    finished = False
    try:
        results = train(cfg, env)
        finished = True
        return results
    except Exception as err:
        abort_job(env, err)  # (under mpirun: a hung peer must not keep the job alive)
        raise
    finally:
        shutdown(env, wait_for_peers=finished)
