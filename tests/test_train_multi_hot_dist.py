"""Multi-hot fields over several gloo ranks on CPU (issue 34): the table fetches each distinct
bag row once per step and never a padding slot; at bound 0 two ranks with a plan (uneven
shards, mirrors) train exactly like one process on the union of their batches (losses, dense
layers, rows); with a real plan and bound 100 a generated multi-hot set trains above its
trivial baseline."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from test_train_dist import _cfg, _ckpt_state, _reference_run, _train_each, _uneven_plan
from test_train_multi_hot import _data

from hetgmp.cli import main as cli_main
from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.data.generate import generate_criteo_like
from hetgmp.embedding import DistributedEmbedding
from hetgmp.embedding.init import initial_rows
from hetgmp.models import model_class
from hetgmp.models.pooling import BagLayout
from hetgmp.partition.plan import load_plan

ROWS, DIM, LR = 12, 3, 0.5
P = -1  # a padding slot
# one single-hot column, then one bag field of width 4 (repeats, short and empty bags); row 11
# is in no bag, so a padding slot read as a Python index (-1 -> the last row) would show there
BATCHES = [
    [[0, 5, 5, 7, P], [1, 7, 5, P, P], [0, P, P, P, P]],  # rank 0: rows 0 1 5 7
    [[2, 5, 8, 8, P], [3, P, P, P, P], [2, 9, 5, 7, 8]],  # rank 1: rows 2 3 5 7 8 9
]


def _one_step(env: DistEnv, pooling: str) -> dict:
    table = DistributedEmbedding(ROWS, DIM, env, optimizer="sgd", lr=LR, exchange="exact")
    ids = torch.tensor(BATCHES[env.rank])
    out = BagLayout(num_single=1, widths=(4,), pooling=(pooling,)).lookup(table, ids)
    counters = dict(table.step_counters())
    (out * _grad(env.rank)).sum().backward()
    sd = table.state_dict()  # (flushes: the owners apply the pushed gradients)
    return {"counters": counters, "ids": sd["ids"], "weight": sd["weight"]}


def _grad(rank: int) -> torch.Tensor:
    return torch.randn(3, 2, DIM, generator=torch.Generator().manual_seed(rank))


def _expected_rows(pooling: str) -> torch.Tensor:
    """One SGD step of a plain table on both ranks' bags (``F.embedding_bag``)."""
    weight = initial_rows(torch.arange(ROWS), DIM, seed=0, scale=0.01).requires_grad_()
    for rank, batch in enumerate(BATCHES):
        ids = torch.tensor(batch)
        bags = ids[:, 1:]
        keep = bags != P
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), keep.sum(1).cumsum(0)[:-1]])
        pooled = F.embedding_bag(bags[keep], weight, offsets, mode=pooling)
        out = torch.stack([F.embedding(ids[:, 0], weight), pooled], dim=1)
        (out * _grad(rank)).sum().backward()
    with torch.no_grad():
        return weight - LR * weight.grad


def test_each_distinct_bag_row_is_fetched_once_and_padding_never() -> None:
    for pooling in ("sum", "mean"):
        ranks = spawn_ranks(_one_step, 2, pooling, timeout_s=60)
        for rank, got in enumerate(ranks):
            distinct = {i for row in BATCHES[rank] for i in row if i != P}
            c = got["counters"]
            assert c["rows_requested"] == len(distinct), (rank, c)
            assert c["rows_owned"] + c["rows_remote"] == len(distinct), (rank, c)
        ids = torch.cat([r["ids"] for r in ranks])
        weight = torch.cat([r["weight"] for r in ranks])[torch.argsort(ids)]
        assert torch.equal(torch.sort(ids).values, torch.arange(ROWS))
        want = _expected_rows(pooling)
        torch.testing.assert_close(weight, want, rtol=0, atol=1e-7)
        init = initial_rows(torch.arange(ROWS), DIM, seed=0, scale=0.01)
        used = sorted({i for b in BATCHES for row in b for i in row if i != P})
        unused = [r for r in range(ROWS) if r not in used]
        assert unused == [4, 6, 10, 11] and torch.equal(weight[unused], init[unused])
        assert (weight[used] - init[used]).abs().min() > 1e-4  # (every used row moved)


def _train_losses(log: Path) -> list[float]:
    rows = map(json.loads, log.read_text().splitlines())
    return [r["loss"] for r in rows if r["kind"] == "train"]


def test_bound0_two_ranks_equal_one_process(tmp_path: Path) -> None:
    """Adagrad + the exact exchange, and SGD + the padded exchange, over an uneven plan with
    every row mirrored; and no plan with mirrors (the three runs in one spawn)."""
    torch.set_num_threads(1)
    ds = _data(tmp_path / "d")
    plan_path = _uneven_plan(ds, 2, tmp_path / "part.npz")
    runs = [
        {"pooling": "sum,mean", "partition": plan_path},
        {"pooling": "mean", "optimizer": "sgd", "lr": 2.0, "replies": "all", "exchange": "padded",
         "partition": plan_path},
        # no plan but mirrors: the run's own plan counts the padded bags' ids, -1 skipped
        {"pooling": "sum", "store_rate": 0.5},
    ]  # fmt: skip
    base = {"model": "wdl", "epochs": 2, "store_rate": 1.0, "bound": 0, "log_every": 1}
    cfgs = []
    for i, run in enumerate(runs):
        out = {"checkpoint_dir": tmp_path / f"ck{i}", "log_json": tmp_path / f"log{i}.jsonl"}
        cfgs.append(_cfg(ds.root, **{**base, **out, **run}))
    ranks = spawn_ranks(_train_each, 2, cfgs, timeout_s=120)
    for i, cfg in enumerate(cfgs):
        assert ranks[0][i]["embedding"]["mirror_hit"] > 0  # mirrors were really used
        dense, weight, ids = _ckpt_state(tmp_path / f"ck{i}")
        assert torch.equal(ids, torch.arange(ds.meta.num_embeddings))
        ref_losses: list[float] = []
        plan = load_plan(plan_path) if cfg.partition else None
        ref_dense, ref_weight = _reference_run(cfg, 2, plan, ref_losses)
        losses = _train_losses(tmp_path / f"log{i}.jsonl")
        shard = int(np.bincount(plan.data_partition).max()) if plan else len(ds.train) // 2
        assert len(losses) == len(ref_losses) == 2 * math.ceil(shard / 32)  # (the larger shard)
        np.testing.assert_allclose(losses, ref_losses, rtol=0, atol=1e-5)
        for k in ref_dense:
            torch.testing.assert_close(dense[k], ref_dense[k], rtol=0, atol=1e-5, msg=k)
        torch.testing.assert_close(weight, ref_weight, rtol=0, atol=1e-5)
        dim = model_class(cfg.model).table_dim(cfg.embed_dim)
        init = initial_rows(
            torch.arange(ds.meta.num_embeddings), dim, seed=cfg.seed, scale=cfg.init_scale
        )
        assert (weight - init).abs().max() > 1e-2  # (the rows moved: not a vacuous comparison)


def test_plan_and_bound100_train_above_the_trivial_baseline(tmp_path: Path) -> None:
    ds = generate_criteo_like(tmp_path / "g", num_samples=12000, scale=0.002, seed=1,
                              multi_hot="2:6", progress=False)  # fmt: skip
    plan = tmp_path / "p.npz"
    assert cli_main(["partition", "--data", str(ds.root), "-n", "2", "-o", str(plan),
                     "--no-progress"]) == 0  # fmt: skip
    cfg = _cfg(ds.root, model="wdl", epochs=2, batch_size=256, partition=plan, store_rate=0.1,
               bound=100, pooling="mean", val=True, lr=0.1, optimizer="adagrad",
               dense_optimizer="adam", dense_lr=0.001, log_every=100)  # fmt: skip
    res = spawn_ranks(_train_each, 2, [cfg], timeout_s=120)[0][0]
    p = float(np.mean(ds.test.labels))
    constant = -(p * math.log(p) + (1 - p) * math.log(1 - p))  # the best constant's logloss
    assert res["val_auc"] > 0.62 and res["val_loss"] < constant - 0.02, res
    assert res["val_auc"] < ds.meta.best_auc
    c = res["embedding_train_counters"]
    # the bound let mirrors read stale rows (it was in force) and the plan kept most rows local
    assert c["rows_mirror_stale_ok"] > 0 and c["rows_owned"] > c["rows_remote"], c


def _train_each_fixed(env: DistEnv, cfgs: list) -> list[dict]:
    from hetgmp.train import multi_hot

    multi_hot.FIXED_SHAPE = True  # (in the spawned ranks)
    return _train_each(env, cfgs)


def test_bound0_fixed_shape_bags_equal_one_process(tmp_path: Path) -> None:
    """The fixed-shape lookup (every bag slot handed to the table, padding standing in for
    the sample's own rows and masked out) on 2 ranks at bound 0 equals one process running
    the compact lookup: Adagrad + the exact exchange, SGD + the padded one."""
    torch.set_num_threads(1)
    ds = _data(tmp_path / "d")
    plan_path = _uneven_plan(ds, 2, tmp_path / "part.npz")
    runs = [
        {"pooling": "sum,mean"},
        {"pooling": "mean", "optimizer": "sgd", "lr": 2.0, "replies": "all", "exchange": "padded"},
    ]
    base = {"model": "wdl", "epochs": 2, "store_rate": 1.0, "bound": 0, "log_every": 1,
            "partition": plan_path}  # fmt: skip
    cfgs = [
        _cfg(
            ds.root,
            **{
                **base,
                **run,
                "checkpoint_dir": tmp_path / f"ck{i}",
                "log_json": tmp_path / f"log{i}.jsonl",
            },
        )  # fmt: skip
        for i, run in enumerate(runs)
    ]
    spawn_ranks(_train_each_fixed, 2, cfgs, timeout_s=120)
    for i, cfg in enumerate(cfgs):
        dense, weight, _ = _ckpt_state(tmp_path / f"ck{i}")
        ref_losses: list[float] = []
        ref_dense, ref_weight = _reference_run(cfg, 2, load_plan(plan_path), ref_losses)
        losses = _train_losses(tmp_path / f"log{i}.jsonl")
        np.testing.assert_allclose(losses, ref_losses, rtol=0, atol=1e-5)
        for k in ref_dense:
            torch.testing.assert_close(dense[k], ref_dense[k], rtol=0, atol=1e-5, msg=k)
        torch.testing.assert_close(weight, ref_weight, rtol=0, atol=1e-5)
