"""``--sync async`` (issue 17): the ZeroMQ row service and the asynchronous step, on spawned
gloo CPU ranks, against the collective path and the protocol's invariants."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from test_embedding import (
    BATCH,
    DIM,
    ROWS,
    make_batches,
    make_grads,
    make_plan,
    rank_slice,
    step_loss,
    union,
)

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.embedding import DistributedEmbedding
from hetgmp.embedding.transport.async_step import AsyncConfig

pytest.importorskip("zmq")

FAST = AsyncConfig(max_lag=0, host="127.0.0.1", timeout_s=20.0)


def table(env: DistEnv, case: dict, sync: str, **kw) -> DistributedEmbedding:
    plan = make_plan("plan", env.world_size, case["seed"])
    return DistributedEmbedding(
        ROWS, DIM, env, plan, store_rate=case["store_rate"], bound=case.get("bound", 0),
        optimizer=case["optimizer"], lr=0.05, seed=case["seed"], adagrad_init=0.1,
        sync=sync, async_config=case.get("async", FAST), **kw,
    )  # fmt: skip


def train(env: DistEnv, case: dict, sync: str) -> dict:
    """Train a case; its owned rows after flush, counters, and the per-rank delays slept."""
    emb = table(env, case, sync)
    sl = rank_slice(env.rank, env.world_size)
    rng = np.random.default_rng(env.rank)
    for ids, g in zip(make_batches(case["seed"], steps=6), make_grads(case["seed"], 6), strict=True):
        if case.get("delay"):
            time.sleep(float(rng.uniform(0, case["delay"])))
        out = emb(torch.from_numpy(ids[sl]))
        step_loss(out, torch.from_numpy(g[sl]), BATCH).backward()
    sd = emb.state_dict()
    out = {"sd": sd, "counters": emb.counters()}
    emb.close()
    return out


def both_ways(env: DistEnv, cases: list[dict]) -> list[dict]:
    return [{s: train(env, c, s) for s in ("collective", "async")} for c in cases]


def test_bound0_maxlag0_equals_collective() -> None:
    cases = [
        {"optimizer": "sgd", "store_rate": 0.3, "seed": 1},
        {"optimizer": "sgd", "store_rate": 0.0, "seed": 2, "delay": 0.02},
    ]
    results = spawn_ranks(both_ways, 2, cases, timeout_s=180)
    for i in range(len(cases)):
        coll = union([r[i]["collective"]["sd"] for r in results])
        asyn = union([r[i]["async"]["sd"] for r in results])
        assert torch.equal(coll["ids"], asyn["ids"])
        torch.testing.assert_close(asyn["weight"], coll["weight"], rtol=1e-5, atol=1e-6)
        for r in results:  # the same reads, row by row
            for k in ("rows_owned", "rows_mirror_fresh", "rows_remote", "rows_requested"):
                assert r[i]["async"]["counters"][k] == r[i]["collective"]["counters"][k], k
