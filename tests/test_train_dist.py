"""Training through the real DistributedEmbedding on spawned gloo ranks, and one mpirun launch.

The anchor: at bound 0, N ranks (any plan, unequal shards, mirrors) train exactly like one process
with the reference table on the same global batches (up to float summation order).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.config import validate
from hetgmp.data.format import open_dataset
from hetgmp.data.loader import BatchLoader, rank_sample_indices
from hetgmp.embedding import ReferenceEmbedding
from hetgmp.models import build_model, model_class
from hetgmp.partition.plan import Plan, load_plan, save_plan
from hetgmp.train.checkpoint import open_checkpoint
from hetgmp.train.config import TrainConfig
from hetgmp.train.multi_hot import bag_layout
from hetgmp.train.multi_hot import prepare as prepare_multi_hot
from hetgmp.train.run import train
from hetgmp.train.runlog import RunLog
from hetgmp.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def _cfg(ds_root: Path, **kw) -> TrainConfig:
    base = dict(
        dataset=str(ds_root),
        batch_size=32,
        embed_dim=4,
        log_every=4,
        progress=False,
        lr=0.1,
        optimizer="adagrad",
        dense_optimizer="sgd",
        dense_lr=0.05,
        warmup_steps=1,
        threads=1,
        val=False,
    )
    base.update(kw)
    return validate(TrainConfig(**base))


def _train_rank(env: DistEnv, cfg: TrainConfig) -> dict:
    return train(cfg, env)


def _train_each(env: DistEnv, cfgs: list[TrainConfig]) -> list[dict]:
    """Independent runs one after another in one spawn (starting ranks costs more)."""
    return [train(cfg, env) for cfg in cfgs]


def _uneven_plan(ds, nparts: int, path: Path) -> Path:
    """Rank 0 gets ~half the samples, the rest share the others; random owners; every rank
    mirrors every row it does not own (store_rate 1)."""
    rng = np.random.default_rng(5)
    n, r = len(ds.train), ds.meta.num_embeddings
    dp = np.where(rng.random(n) < 0.5, 0, rng.integers(0, nparts, n)).astype(np.int32)
    ep = rng.integers(0, nparts, r).astype(np.int32)
    mirrors = [rng.permutation(np.flatnonzero(ep != w)).astype(np.int64) for w in range(nparts)]
    return save_plan(Plan(dp, ep, mirrors, {"dataset_fingerprint": ds.fingerprint}), path)


def _reference_run(cfg: TrainConfig, nparts: int, plan: Plan | None, losses: list | None = None):
    """One process, reference table, each step's batch = the union of the ranks' batches
    (``losses`` gets each step's mean loss). A multi-hot set's bags are padded and pooled as
    ``hetgmp train`` does (:mod:`hetgmp.train.multi_hot`)."""
    ds = prepare_multi_hot(cfg, DistEnv.single(), open_dataset(cfg.dataset))
    bags = bag_layout(cfg, ds)
    cls = model_class(cfg.model)
    torch.manual_seed(cfg.seed)
    emb = ReferenceEmbedding(
        ds.meta.num_embeddings,
        cls.table_dim(cfg.embed_dim),
        optimizer=cfg.optimizer,
        lr=cfg.lr,
        init_scale=cfg.init_scale,
        adagrad_init=cfg.adagrad_init,
        seed=cfg.seed,
    )
    model = build_model(
        cfg.model,
        emb,
        num_fields=bags.num_fields if bags is not None else ds.meta.num_fields,
        num_dense=ds.meta.num_dense,
        embed_dim=cfg.embed_dim,
    )
    model.bags = bags
    env = DistEnv.single()
    tr = Trainer(cfg, env, ds, model, RunLog(active=False), indices=np.arange(len(ds.train)))
    shards = [rank_sample_indices(len(ds.train), r, nparts, plan) for r in range(nparts)]
    steps = 0
    for epoch in range(cfg.epochs):
        loaders = [
            iter(
                BatchLoader(
                    ds.train, cfg.batch_size, indices=s, shuffle=True, seed=cfg.seed, epoch=epoch
                )
            )
            for s in shards
        ]
        spe = max(-(-s.size // cfg.batch_size) for s in shards)
        for _ in range(spe):
            if cfg.iter and steps >= cfg.iter:
                break
            parts = [b for b in (next(it, None) for it in loaders) if b is not None]
            cat = lambda xs: np.concatenate(xs)  # noqa: E731
            from hetgmp.data.loader import Batch

            batch = Batch(
                cat([b.sparse for b in parts]),
                cat([b.dense for b in parts]) if parts[0].dense is not None else None,
                cat([b.labels for b in parts]),
                cat([b.indices for b in parts]),
            )
            loss, _, n = tr.step(batch, len(batch.labels))
            if losses is not None:
                losses.append(loss / n)
            steps += 1
    emb.flush()
    return model.dense_state_dict(), emb.weight.clone()


def _ckpt_state(ckdir: Path):
    ck = open_checkpoint(ckdir)
    u = ck.embedding_union()
    order = torch.argsort(u["ids"])
    return ck.dense()["model"], u["weight"][order], u["ids"][order]


def test_bound0_n_ranks_equal_one_process(tiny_dataset, tmp_path) -> None:
    """Adagrad + the exact exchange, and SGD + the padded exchange (--exchange padded), on 3
    ranks (both runs in one spawn)."""
    nparts = 3
    plan_path = _uneven_plan(tiny_dataset, nparts, tmp_path / "part.npz")
    sparses = [{}, {"optimizer": "sgd", "replies": "all", "exchange": "padded"}]
    cfgs = [
        _cfg(
            tiny_dataset.root,
            model="dfm",
            epochs=2,
            partition=plan_path,
            store_rate=1.0,
            bound=0,
            checkpoint_dir=tmp_path / f"ck{i}",
            **sparse,
        )
        for i, sparse in enumerate(sparses)
    ]
    ranks = spawn_ranks(_train_each, nparts, cfgs, timeout_s=180)
    for i, cfg in enumerate(cfgs):
        assert ranks[0][i]["embedding"]["mirror_hit"] > 0  # mirrors were really used
        dense, weight, ids = _ckpt_state(tmp_path / f"ck{i}")
        assert torch.equal(ids, torch.arange(tiny_dataset.meta.num_embeddings))
        ref_dense, ref_weight = _reference_run(cfg, nparts, load_plan(plan_path))
        # SGD on the dense side: Adam divides tiny gradients by their tiny running norm, which
        # magnifies summation-order noise (1e-9) into 1e-5 differences without any bug.
        for k in ref_dense:
            torch.testing.assert_close(dense[k], ref_dense[k], rtol=0, atol=1e-6, msg=k)
        torch.testing.assert_close(weight, ref_weight, rtol=0, atol=1e-6)
        # the state moved away from its initial values: the comparison is not vacuous
        init = ReferenceEmbedding(tiny_dataset.meta.num_embeddings, 5, seed=0).weight
        assert (weight - init).abs().max() > 1e-2


def test_resume_exact_and_other_worker_count(tiny_dataset, tmp_path) -> None:
    kw = dict(model="wdl", bound=0, dense_optimizer="adam", dense_lr=0.01)  # Adam: state restored
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    # (the two fresh runs share a spawn; the resume starts new processes, as a user's would)
    spawn_ranks(_train_each, 2, [
        _cfg(tiny_dataset.root, iter=10, checkpoint_dir=straight, **kw),
        _cfg(tiny_dataset.root, iter=5, checkpoint_dir=halves, **kw),
    ])  # fmt: skip
    spawn_ranks(
        _train_rank, 2, _cfg(tiny_dataset.root, iter=10, checkpoint_dir=halves, resume=True, **kw)
    )
    (da, wa, _), (db, wb, _) = _ckpt_state(straight), _ckpt_state(halves)
    for k in da:
        torch.testing.assert_close(da[k], db[k], rtol=0, atol=1e-6, msg=k)
    torch.testing.assert_close(wa, wb, rtol=0, atol=1e-6)
    # the 2-rank checkpoint loads on 1 process (rows keyed by global id) with the same rows
    for n in (1,):
        moved = tmp_path / f"on{n}"
        shutil.copytree(halves / "step-00000010", moved / "step-00000010")
        (moved / "latest").write_text("step-00000010\n")
        cfg = _cfg(tiny_dataset.root, iter=10, checkpoint_dir=moved, resume=True, **kw)
        if n == 1:
            train(cfg, DistEnv.single())
        else:
            spawn_ranks(_train_rank, n, cfg)
        dn, wn, _ = _ckpt_state(moved)
        torch.testing.assert_close(wn, wb, rtol=0, atol=0)
        for k in db:
            torch.testing.assert_close(dn[k], db[k], rtol=0, atol=0)


def test_bound100_trains_with_mirrors(tiny_dataset, tmp_path) -> None:
    plan_path = _uneven_plan(tiny_dataset, 2, tmp_path / "part.npz")
    cfg = _cfg(
        tiny_dataset.root,
        model="dlrm",
        iter=8,
        partition=plan_path,
        store_rate=0.5,
        bound=100,
        val=True,
        log_json=tmp_path / "log.jsonl",
    )
    res = spawn_ranks(_train_rank, 2, cfg)
    assert res[0]["val_auc"] == res[1]["val_auc"] and 0.0 <= res[0]["val_auc"] <= 1.0
    assert res[0]["embedding"]["mirror_hit"] > 0.5
    text = (tmp_path / "log.jsonl").read_text()
    assert '"bytes_per_sample"' in text and '"mirror_hit"' in text


@pytest.mark.mpi
def test_mpirun_cli_smoke(tiny_dataset, tmp_path) -> None:
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    env = dict(
        os.environ,
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
    )
    base = [
        str(mpirun),
        "-np",
        "2",
        sys.executable,
        str(ROOT / "examples" / "hetuctr.py"),
        "--dataset",
        str(tiny_dataset.root),
        "--batch_size",
        "32",
        "--embed_dim",
        "4",
        "--log_every",
        "3",
        "--no-progress",
        "--threads",
        "1",
    ]
    out = tmp_path / "res.json"
    p = subprocess.run(
        [*base, "--iter", "6", "--output", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # all of stderr: an abort's backtrace (Open MPI prints one per rank) runs past 2,000 chars
    assert p.returncode == 0, f"mpirun exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr}"
    assert re.search(r"^TRAIN 3: loss \S+ acc \S+ time \S+ speed \S+", p.stdout, re.M)
    assert re.search(r"^EVAL 6: val_loss \S+ val_acc \S+ val_auc \S+", p.stdout, re.M)
    assert "launcher mpirun, 2 rank(s)" in p.stdout and "hash placement" in p.stdout
    assert out.exists()
    # a plan made for 3 workers: every rank stops with a clear message, no hang
    plan = _uneven_plan(tiny_dataset, 3, tmp_path / "p3.npz")
    p = subprocess.run(
        [*base, "--iter", "2", "--partition", str(plan)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode != 0
    assert "made for 3 workers but 2 are running" in p.stderr
    assert "Traceback" not in p.stderr


def test_bound100_train_loss_tracks_bound0(tiny_dataset, tmp_path) -> None:
    """Regression: with Adagrad (accumulators start at 0) mirrors once stepped at lr / eps, so
    the TRAIN loss at bound 100 was far above bound 0's (0.80 vs ~0.5 on criteo-like)."""
    plan_path = _uneven_plan(tiny_dataset, 2, tmp_path / "part.npz")
    bounds = (0, 100)
    cfgs = [
        _cfg(
            tiny_dataset.root,
            model="wdl",
            epochs=3,
            partition=plan_path,
            store_rate=1.0,
            bound=bound,
            log_json=tmp_path / f"log{bound}.jsonl",
        )
        for bound in bounds
    ]
    spawn_ranks(_train_each, 2, cfgs)  # (both runs in one spawn)
    losses = {}
    for bound, cfg in zip(bounds, cfgs, strict=True):
        recs = [json.loads(line) for line in cfg.log_json.read_text().splitlines()]
        losses[bound] = [r["loss"] for r in recs if r["kind"] == "train"]
    assert len(losses[0]) == len(losses[100]) > 3
    for l0, l100 in zip(losses[0], losses[100], strict=True):
        assert abs(l100 - l0) < 0.05, (losses[0], losses[100])


def test_resume_on_another_worker_count_trains_the_remaining_epochs(tiny_dataset, tmp_path) -> None:
    """1 epoch on 2 ranks, then ``--epochs 2`` resumed on 1 process: exactly one more epoch
    (the steps done are counted in the new world's steps), and ``samples_seen`` is the whole
    run's (the resumed part's own count is ``samples_this_process``)."""
    kw = dict(model="wdl", bound=0, val=False)
    ck = tmp_path / "ck"
    spawn_ranks(_train_rank, 2, _cfg(tiny_dataset.root, epochs=1, checkpoint_dir=ck, **kw))
    res = train(_cfg(tiny_dataset.root, epochs=2, checkpoint_dir=ck, resume=True, **kw),
                DistEnv.single())  # fmt: skip
    n = len(tiny_dataset.train)
    spe_1 = -(-n // _cfg(tiny_dataset.root).batch_size)  # steps per epoch on one process
    assert res["step"] == 2 * spe_1 and res["epoch"] == 2
    assert res["samples_this_process"] == n  # one epoch trained here
    assert res["samples_seen"] == 2 * n


def test_no_partition_with_mirrors_makes_its_own_plan(tiny_dataset, tmp_path) -> None:
    """HET-GMP's habit: ``--store_rate`` without ``--partition``. Rows get random owners,
    each rank mirrors the rows its own samples use most (said in one log line), mirrors are
    read, and at bound 0 training still equals one process on the same global batches."""
    from hetgmp.partition.fallback import local_frequency_plan

    ck = tmp_path / "ck"
    cfg = _cfg(tiny_dataset.root, epochs=1, store_rate=0.2, bound=0, checkpoint_dir=ck)
    res = spawn_ranks(_train_rank, 2, cfg, timeout_s=180)
    assert res[0]["embedding"]["mirror_hit"] > 0
    _, weight, ids = _ckpt_state(ck)
    assert torch.equal(ids, torch.arange(tiny_dataset.meta.num_embeddings))
    _, ref_weight = _reference_run(cfg, 2, None)
    torch.testing.assert_close(weight, ref_weight, rtol=0, atol=1e-6)
    # the list: rows this rank does not own, used by its samples, most used first
    sparse = tiny_dataset.train.sparse
    idx = np.arange(len(tiny_dataset.train) // 2)
    plan = local_frequency_plan(sparse, idx, tiny_dataset.meta.num_embeddings, 2, 0, seed=0)
    mine = plan.mirrors[0]
    counts = np.bincount(np.asarray(sparse[idx]).ravel(), minlength=len(plan.embed_partition))
    assert mine.size and (plan.embed_partition[mine] != 0).all() and (counts[mine] > 0).all()
    assert (np.diff(counts[mine]) <= 0).all() and plan.mirrors[1].size == 0


def test_checkpoint_rows_are_read_per_rank(tiny_dataset, tmp_path) -> None:
    """A rank reads only the rows it stores from a checkpoint (each shard memory-mapped): the
    rows asked for, in any order and from several shards, equal the union's; ids no shard
    holds are left out (the table then names them)."""
    ck = tmp_path / "ck"
    spawn_ranks(_train_rank, 2, _cfg(tiny_dataset.root, iter=3, checkpoint_dir=ck, val=False))
    loaded = open_checkpoint(ck)
    union = loaded.embedding_union()
    want = torch.tensor([5, 0, 17, 3, 16, 11])
    got = loaded.embedding_rows(torch.cat([want, torch.tensor([10**9])]))
    assert sorted(got["ids"].tolist()) == sorted(want.tolist())
    for i, row in zip(got["ids"].tolist(), got["weight"], strict=True):
        torch.testing.assert_close(row, union["weight"][union["ids"] == i][0], rtol=0, atol=0)
    for i, s in zip(got["ids"].tolist(), got["opt_state"], strict=True):
        assert s == union["opt_state"][union["ids"] == i][0]


def test_resume_on_three_ranks_mid_epoch_skips_no_samples(tiny_dataset, tmp_path) -> None:
    """4 steps on 2 ranks (mid-epoch), the epoch finished on 3 ranks (issue 31, item 7): the
    share-of-steps rounding skipped a global step's samples (here 32 of 400); now none are, and
    the samples trained twice (the shards differ) are fewer than one global step and logged."""
    kw = dict(model="wdl", bound=0, val=False)
    ck, log = tmp_path / "ck", tmp_path / "resume.jsonl"
    spawn_ranks(_train_rank, 2, _cfg(tiny_dataset.root, iter=4, checkpoint_dir=ck, **kw))
    cfg = _cfg(tiny_dataset.root, epochs=1, checkpoint_dir=ck, resume=True, log_json=log, **kw)
    res = spawn_ranks(_train_rank, 3, cfg)[0]
    n, bs = len(tiny_dataset.train), cfg.batch_size
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    (note,) = [r for r in recs if "rank checkpoint on 3 ranks" in r.get("message", "")]
    assert note["samples_done"] == 4 * 2 * bs and "none skipped" in note["message"]
    assert 0 <= note["samples_repeated"] < 3 * bs
    assert res["samples_seen"] == n + note["samples_repeated"]  # every sample of the epoch
