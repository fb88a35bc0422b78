"""``--sync async`` on CUDA ranks (issue 17): rows, versions and optimizer state on the GPU,
messages through pinned host buffers. The ranks are spawned processes joined by a gloo group
(gloo moves CUDA tensors too), all on GPU 0, so one GPU is enough (NCCL refuses two ranks on
one GPU). Skipped without CUDA; ``bash bench/gpu/async_smoke.sh`` runs them on a GPU machine."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch
from test_async import assert_async_equals_collective, audit_steps
from test_embedding import (
    BATCH,
    DIM,
    ROWS,
    make_batches,
    make_grads,
    make_plan,
    rank_slice,
    step_loss,
)

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.embedding import DistributedEmbedding
from hetgmp.embedding.rowservice import AsyncConfig, AsyncStep

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("zmq")

FAST = AsyncConfig(max_lag=0, host="127.0.0.1", timeout_s=60.0)


def on_gpu(env: DistEnv) -> DistEnv:
    """The spawned rank's environment (gloo group) with its tensors on GPU 0."""
    torch.cuda.set_device(0)
    return dataclasses.replace(env, device=torch.device("cuda", 0))


def train_on_gpu(env: DistEnv, case: dict, sync: str) -> dict:
    """SGD, bound 0: the owned rows after flush (on the host) and the counters."""
    genv = on_gpu(env)
    emb = DistributedEmbedding(
        ROWS, DIM, genv, make_plan("plan", env.world_size, case["seed"]),
        store_rate=case["store_rate"], bound=0, optimizer="sgd", lr=0.05, seed=case["seed"],
        sync=sync, async_config=FAST, replies=case.get("replies", "stale"), exchange="exact",
    )  # fmt: skip
    assert emb.store.weight.is_cuda
    if sync == "async":
        assert isinstance(emb._stepper, AsyncStep) and emb._stepper.service.stream is not None
    sl = rank_slice(env.rank, env.world_size)
    rng = np.random.default_rng(env.rank)
    batches = make_batches(case["seed"], steps=6)
    for ids, g in zip(batches, make_grads(case["seed"], 6), strict=True):
        if case.get("delay"):
            time.sleep(float(rng.uniform(0, case["delay"])))
        out = emb(torch.from_numpy(ids[sl]).cuda())
        step_loss(out, torch.from_numpy(g[sl]).cuda(), BATCH).backward()
    sd = {k: v.cpu() for k, v in emb.state_dict().items()}
    out = {"sd": sd, "counters": emb.counters()}
    emb.close()
    return out


def both_ways(env: DistEnv, cases: list[dict]) -> list[dict]:
    return [{s: train_on_gpu(env, c, s) for s in ("collective", "async")} for c in cases]


def test_cuda_bound0_maxlag0_equals_collective() -> None:
    cases = [
        {"store_rate": 0.3, "seed": 1},
        {"store_rate": 0.5, "seed": 2, "delay": 0.02, "replies": "all"},
        {"store_rate": 0.0, "seed": 3, "delay": 0.02},
    ]
    results = spawn_ranks(both_ways, 2, cases, timeout_s=300, collective_timeout_s=120)
    assert_async_equals_collective(results, len(cases), atol=1e-5)


# ---------------------------------------------------------------- audited, random delays
def audited_on_gpu(env: DistEnv, bound: int, max_lag: int, seed: int) -> dict:
    """SGD, lr 1, loss = sum of column 0: a value's column 0 counts the updates in it, so every
    read's lag is measured from the values themselves (as tests/test_async.py on the CPU)."""
    world, genv = env.world_size, on_gpu(env)
    emb = DistributedEmbedding(
        ROWS, DIM, genv, make_plan("plan", world, seed), store_rate=0.5, bound=bound,
        optimizer="sgd", lr=1.0, seed=seed, init_scale=0.01, audit=True, sync="async",
        async_config=AsyncConfig(max_lag=max_lag, host="127.0.0.1", timeout_s=60.0),
    )  # fmt: skip
    return audit_steps(emb, genv, bound, seed)


@pytest.mark.parametrize("bound,max_lag", [(0, 2), (3, 2)])
def test_cuda_every_read_within_bound_under_random_delays(bound: int, max_lag: int) -> None:
    results = spawn_ranks(
        audited_on_gpu, 3, bound, max_lag, 5, timeout_s=300, collective_timeout_s=120
    )
    assert max(r["worst"] for r in results) <= bound
    if bound == 0:
        assert sum(r["stale"] for r in results) == 0
    c = [r["counters"] for r in results]
    for kind in ("ids", "versions", "values", "gradients"):
        assert sum(x[f"bytes_sent_{kind}"] for x in c) == sum(x[f"bytes_recv_{kind}"] for x in c)
    for r, x in zip(results, c, strict=True):
        assert x["rows_requested"] == r["requested"]
    assert sum(x["pushes_sent"] for x in c) > 0


# ---------------------------------------------------------------- the trainer
def train_rank_on_gpu(env: DistEnv, cfg) -> dict:
    from hetgmp.train.run import train

    return train(cfg, on_gpu(env))


def test_cuda_trainer_async_equals_collective(tiny_dataset, tmp_path) -> None:
    """``hetgmp train --device cuda --backend gloo --sync async`` (2 ranks, one GPU) ends
    with the checkpoint of ``--sync collective`` (SGD rows and dense layers, fp32)."""
    from test_train_dist import _cfg, _ckpt_state, _uneven_plan

    plan = _uneven_plan(tiny_dataset, 2, tmp_path / "part.npz")
    states = {}
    for sync in ("collective", "async"):
        extra = {"async_host": "127.0.0.1"} if sync == "async" else {}
        cfg = _cfg(
            tiny_dataset.root, model="wdl", iter=8, partition=plan, store_rate=0.5, bound=0,
            optimizer="sgd", checkpoint_dir=tmp_path / sync, sync=sync, device="cuda",
            backend="gloo", amp=False, matmul_precision="highest", **extra,
        )  # fmt: skip
        res = spawn_ranks(train_rank_on_gpu, 2, cfg, timeout_s=300, collective_timeout_s=120)
        assert res[0]["embedding"]["mirror_hit"] > 0  # mirrors were really used
        states[sync] = _ckpt_state(tmp_path / sync)
    (d0, w0, i0), (d1, w1, i1) = states["collective"], states["async"]
    assert torch.equal(i0, i1)
    torch.testing.assert_close(w1, w0, rtol=1e-5, atol=1e-5)
    for k in d0:
        torch.testing.assert_close(d1[k].cpu(), d0[k].cpu(), rtol=1e-5, atol=1e-5, msg=k)


def test_cuda_work_stealing_trains_each_batch_once(tiny_dataset) -> None:
    """Work stealing on CUDA ranks: the claim replies cross the wire as host frames (a reply
    tensor on the GPU used to fail the first claim), and both epochs train each batch once."""
    from test_train_dist import _cfg

    cfg = _cfg(
        tiny_dataset.root, batch_size=32, epochs=2, sync="async", device="cuda", backend="gloo",
        async_host="127.0.0.1", max_lag=-1, straggle="1:4", timeout_s=60.0,
    )  # fmt: skip
    res = spawn_ranks(train_rank_on_gpu, 2, cfg, timeout_s=300, collective_timeout_s=120)
    a = res[0]["async"]
    assert a["stolen_per_rank"][0] > 0, a
    cov = a["coverage"]
    for e in (0, 1):
        i = cov["epochs"].index(e)
        assert cov["missing"][i] == 0 and cov["repeated"][i] == 0, cov
