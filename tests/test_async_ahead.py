"""Reads sent ahead (``AsyncStep.send_ahead``, ``DistributedEmbedding.send_ahead``): the next
batch's push and reads sent right after backward and taken by the next forward train exactly
as steps that send them at the forward (bound 0 / max-lag 0 on spawned gloo CPU ranks), a
forward given other ids drops them, and the bytes still add up."""

from __future__ import annotations

import pytest
import test_embedding as te
import torch
from test_async import FAST

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.embedding import DistributedEmbedding

pytest.importorskip("zmq")
STEPS = 6


def train(env: DistEnv, case: dict, mode: str) -> dict:
    """``mode``: ``plain`` (reads at the forward), ``ahead`` (the next batch's reads sent
    after each backward), ``other`` (sent ahead for a copy of the next ids: dropped)."""
    plan = te.make_plan("plan", env.world_size, case["seed"])
    emb = DistributedEmbedding(
        te.ROWS, te.DIM, env, plan, store_rate=case["store_rate"], bound=0,
        optimizer=case["optimizer"], lr=0.05, seed=case["seed"], adagrad_init=0.1,
        sync="async", async_config=FAST,
    )  # fmt: skip
    sl = te.rank_slice(env.rank, env.world_size)
    batches = [torch.from_numpy(b[sl]) for b in te.make_batches(case["seed"], steps=STEPS)]
    grads = [torch.from_numpy(g[sl]) for g in te.make_grads(case["seed"], STEPS)]
    outs = []
    for t in range(STEPS):
        out = emb(batches[t])
        outs.append(out.detach().clone())
        te.step_loss(out, grads[t], te.BATCH).backward()
        if mode != "plain" and t + 1 < STEPS:
            emb.send_ahead(batches[t + 1] if mode == "ahead" else batches[t + 1].clone())
    sd = emb.state_dict()
    res = {"sd": sd, "counters": emb.counters(), "outs": outs}
    emb.close()
    return res


def all_modes(env: DistEnv, cases: list[dict]) -> list[dict]:
    return [{m: train(env, c, m) for m in ("plain", "ahead", "other")} for c in cases]


def test_reads_sent_ahead_train_as_reads_sent_at_the_forward() -> None:
    cases = [
        {"optimizer": "sgd", "store_rate": 0.3, "seed": 1},
        {"optimizer": "adagrad", "store_rate": 0.3, "seed": 6},
        {"optimizer": "adagrad", "store_rate": 0.0, "seed": 7},
    ]
    results = spawn_ranks(all_modes, 2, cases, timeout_s=180)
    for i in range(len(cases)):
        plain = te.union([r[i]["plain"]["sd"] for r in results])
        for mode in ("ahead", "other"):
            got = te.union([r[i][mode]["sd"] for r in results])
            assert torch.equal(got["ids"], plain["ids"])
            torch.testing.assert_close(got["weight"], plain["weight"], rtol=1e-6, atol=1e-7)
            for r in results:  # every step read the same values, and the same rows
                for a, b in zip(r[i][mode]["outs"], r[i]["plain"]["outs"], strict=True):
                    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
                for k in ("rows_owned", "rows_mirror_fresh", "rows_remote", "pushes_sent"):
                    assert r[i][mode]["counters"][k] == r[i]["plain"]["counters"][k], (mode, k)
        for mode in ("plain", "ahead", "other"):  # what one rank sent, the other received
            a, b = (r[i][mode]["counters"] for r in results)
            assert a["bytes_sent_ids"] + b["bytes_sent_ids"] == (
                a["bytes_recv_ids"] + b["bytes_recv_ids"]
            ), mode
