"""Multi-hot fields under ``--sync async`` (issue 34) on two gloo ranks over real sockets: at
bound 0 (``--max-lag 0``) the run equals the collective engine's on the same data and plan
(rows, dense layers, val loss); at bound 100 with unequal steps (``--max-lag 2``) it trains,
mirrors read stale rows and every step takes the reads its previous step sent ahead (the bags'
ids, padding taken out); and the table's staleness audit (as ``test_async``'s) holds for reads
through pooled bags at bound 0 and 3."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_async import measured_lag
from test_embedding import DIM, ROWS, make_plan
from test_train_dist import _cfg, _ckpt_state, _train_each, _uneven_plan
from test_train_multi_hot import _data

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.embedding import DistributedEmbedding
from hetgmp.embedding.init import initial_rows
from hetgmp.embedding.rowservice import AsyncConfig, AsyncStep
from hetgmp.models.pooling import BagLayout
from hetgmp.train.config import TrainConfig
from hetgmp.train.run import train

pytest.importorskip("zmq")

ASYNC = {"sync": "async", "async_host": "127.0.0.1"}


def test_bound0_async_equals_collective(tmp_path: Path) -> None:
    """Adagrad over an uneven plan with every row mirrored, sum and mean pooling: the same
    checkpoint (ids exact, rows and dense layers to 1e-6, as the single-hot test asserts) and
    the same val loss."""
    ds = _data(tmp_path / "d")
    plan = _uneven_plan(ds, 2, tmp_path / "part.npz")
    base = {"model": "wdl", "epochs": 2, "partition": plan, "store_rate": 1.0, "bound": 0,
            "pooling": "sum,mean", "val": True, "device": "cpu"}  # fmt: skip
    cfgs = [
        _cfg(ds.root, **base, checkpoint_dir=tmp_path / sync, **(ASYNC if sync == "async" else {}))
        for sync in ("collective", "async")
    ]
    coll, asyn = spawn_ranks(_train_each, 2, cfgs, timeout_s=120)[0]
    assert coll["embedding"]["mirror_hit"] > 0 and asyn["embedding"]["mirror_hit"] > 0
    assert asyn["embedding_train_counters"]["pushes_sent"] > 0  # (the row service was used)
    (d0, w0, i0), (d1, w1, i1) = (
        _ckpt_state(tmp_path / "collective"),
        _ckpt_state(tmp_path / "async"),
    )
    assert torch.equal(i0, i1) and torch.equal(i0, torch.arange(ds.meta.num_embeddings))
    torch.testing.assert_close(w1, w0, rtol=0, atol=1e-6)
    for k in d0:
        torch.testing.assert_close(d1[k], d0[k], rtol=0, atol=1e-6, msg=k)
    assert math.isclose(asyn["val_loss"], coll["val_loss"], rel_tol=0, abs_tol=1e-6)


def _counting_ahead(env: DistEnv, cfg: TrainConfig) -> dict:
    """One run, counting the reads sent ahead and the training steps that took them
    (``AsyncStep.step``'s own test of "the same prep", wrapped in this process)."""
    counts = {"taken": 0, "sent": 0}
    step, send = AsyncStep.step, AsyncStep.send_ahead

    def counted_step(self: AsyncStep, prep: Any, **kw: Any) -> Any:
        counts["taken"] += self.ahead is not None and self.ahead.prep is prep
        return step(self, prep, **kw)

    def counted_send(self: AsyncStep, prep: Any) -> None:
        send(self, prep)
        counts["sent"] += self.ahead is not None

    AsyncStep.step, AsyncStep.send_ahead = counted_step, counted_send  # (this process only)
    return {**train(cfg, env), "ahead": counts}


def test_bound100_unequal_steps_trains_with_reads_sent_ahead(tmp_path: Path) -> None:
    ds = _data(tmp_path / "d")
    plan = _uneven_plan(ds, 2, tmp_path / "part.npz")
    cfg = _cfg(ds.root, model="wdl", epochs=3, partition=plan, store_rate=0.5, bound=100,
               max_lag=2, pooling="mean", val=True, device="cpu", **ASYNC)  # fmt: skip
    ranks = spawn_ranks(_counting_ahead, 2, cfg, timeout_s=120)
    res = ranks[0]
    p = float(np.mean(ds.test.labels))
    constant = -(p * math.log(p) + (1 - p) * math.log(1 - p))  # the best constant's logloss
    assert res["val_loss"] < constant, res["val_loss"]  # (it learned the planted bags)
    assert res["async"]["budget"] == 3 * len(ds.train)
    for rank, r in enumerate(ranks):
        a, steps = r["ahead"], res["async"]["steps_per_rank"][rank]
        # every step after the first took the reads its previous step sent (the bags' ids, not
        # the padded batch: that one the table refuses ahead); the last sent, the budget drops
        assert a["taken"] == steps - 1 and a["sent"] == steps, (a, steps)
    c = res["embedding_train_counters"]
    assert c["rows_mirror_stale_ok"] > 0, c  # (the bound was in force: mirrors read stale)


def _bag_batches(rank: int, steps: int) -> list[torch.Tensor]:
    """``[8, 1 + 6]`` batches: one single-hot id, then a bag of up to 6 skewed ids (repeats,
    padding, empty bags) over ``ROWS`` rows; the ranks' batches overlap."""
    rng = np.random.default_rng(40 + rank)
    out = []
    for _ in range(steps):
        ids = np.minimum(rng.zipf(1.3, (8, 7)) - 1, ROWS - 1)
        ids[:, 1:][np.arange(6) >= rng.integers(0, 7, (8, 1))] = -1
        out.append(torch.from_numpy(ids))
    return out


def _audited_bags(env: DistEnv, bound: int) -> dict:
    """SGD, lr 1, loss = the sum of the sum-pooled rows' column 0: every bag value's row gets
    gradient 1 there, as a single-hot id's does (``test_async.audit_steps``), so a value's
    column 0 counts the updates in it and each read's lag is measured from the values. Ranks
    at uneven speeds, each step's push and the next batch's reads sent ahead."""
    emb = DistributedEmbedding(
        ROWS, DIM, env, make_plan("plan", 2, 5), store_rate=0.5, bound=bound, optimizer="sgd",
        lr=1.0, seed=5, init_scale=0.01, audit=True, sync="async",
        async_config=AsyncConfig(max_lag=2, host="127.0.0.1", timeout_s=30.0),
    )  # fmt: skip
    bags = BagLayout(num_single=1, widths=(6,), pooling=("sum",))
    init0 = initial_rows(torch.arange(ROWS), DIM, seed=5, scale=0.01)[:, 0]
    batches, worst, stale = _bag_batches(env.rank, 12), 0, 0
    for t, ids in enumerate(batches):
        time.sleep(0.01 * env.rank * (t % 3))  # uneven per-rank speeds
        bags.lookup(emb, ids)[..., 0].sum().backward()
        if t + 1 < len(batches):
            emb.send_ahead(bags.table_ids(batches[t + 1]))
        lag = measured_lag(emb.last_audit, init0)
        if lag.numel():
            worst, stale = max(worst, int(lag.max())), stale + int((lag > 0).sum())
        distinct = torch.unique(ids[ids >= 0]).numel()  # (padding never requested)
        assert emb.step_counters()["rows_requested"] == distinct
    emb.flush()
    out = {"worst": worst, "stale": stale, "counters": emb.counters()}
    emb.close()
    return out


@pytest.mark.parametrize("bound", [0, 3])
def test_pooled_reads_stay_within_the_bound(bound: int) -> None:
    """The staleness audit (as ``test_async``'s on single ids) holds for bag reads."""
    results = spawn_ranks(_audited_bags, 2, bound, timeout_s=120)
    assert max(r["worst"] for r in results) <= bound
    if bound == 0:
        assert sum(r["stale"] for r in results) == 0
    else:
        assert sum(r["stale"] for r in results) > 0  # (stale reads happened: the bound mattered)
    c = [r["counters"] for r in results]
    for kind in ("ids", "versions", "values", "gradients"):
        assert sum(x[f"bytes_sent_{kind}"] for x in c) == sum(x[f"bytes_recv_{kind}"] for x in c)
    assert sum(x["pushes_sent"] for x in c) > 0
