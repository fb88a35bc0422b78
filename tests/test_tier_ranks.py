"""Several ranks with owned rows on the host tier (hetgmp/embedding/tier_owned.py) over real
gloo ranks: with a plan and mirrors, a 5 % device cache per rank trains every step's output
and every owned row (values, optimizer state) exactly like the all-on-device table, at bound
0 and at a looser bound with the staleness audit on, through evaluation steps and a state
dict round trip; the cache really missed and wrote rows back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.embedding import DistributedEmbedding
from hetgmp.partition.plan import Plan

ROWS, DIM, FIELDS, BATCH, STEPS = 6000, 4, 3, 8, 24


def _plan(world: int) -> Plan:
    rng = np.random.default_rng(2)
    owner = rng.integers(0, world, ROWS).astype(np.int32)
    prio = [rng.permutation(ROWS) for _ in range(world)]
    mirrors = [p[owner[p] != w] for w, p in enumerate(prio)]
    return Plan(np.zeros(world * BATCH, np.int32), owner, mirrors, {})


def _batches(rank: int) -> list[torch.Tensor]:
    """Skewed ids (hot rows repeat across steps and ranks) with a cold tail (misses)."""
    rng = np.random.default_rng(10 + rank)
    return [
        torch.from_numpy(np.minimum(rng.zipf(1.2, (BATCH, FIELDS)) - 1, ROWS - 1))
        for _ in range(STEPS)
    ]


def _run(env: DistEnv, case: dict) -> dict:
    """Both tables (all on the device; owned rows on the host tier) on the same batches."""
    out: dict = {}
    for rows_on in ("device", "host"):
        kw = {"rows_on": "host", "cache_budget": 0.05} if rows_on == "host" else {}
        emb = DistributedEmbedding(
            ROWS, DIM, env, _plan(env.world_size), store_rate=0.02, bound=case["bound"],
            optimizer=case["opt"], lr=0.1, adagrad_init=0.1, seed=4, audit=case["audit"], **kw,
        )  # fmt: skip
        g = torch.Generator().manual_seed(20 + env.rank)
        outs = []
        for i, ids in enumerate(_batches(env.rank)):
            if i == 8:  # an evaluation step between training steps
                emb.eval()
                with torch.no_grad():
                    outs.append(emb(ids[:3]).clone())
                emb.train()
            if i == 16:  # a checkpoint round trip (rows keyed by id, both ranks' union)
                from hetgmp.comm.collectives import all_gather_object

                sds = all_gather_object(env, emb.state_dict())
                emb.load_state_dict({k: torch.cat([s[k] for s in sds]) for k in sds[0]})
            o = emb(ids)
            outs.append(o.detach().clone())
            (o * torch.randn(o.shape, generator=g) + o**2).sum().backward()
        sd = emb.state_dict()
        out[rows_on] = {"outs": outs, "sd": sd, "counters": emb.counters()}
        if emb.tier is not None:
            out["n_own"] = emb.n_own
            out["budget"] = emb.tier.budget
    return out


@pytest.mark.parametrize(
    "case",
    [
        {"bound": 0, "opt": "adagrad", "audit": False},
        {"bound": 0, "opt": "sgd", "audit": False},
        {"bound": 3, "opt": "adagrad", "audit": True},
    ],
    ids=["bound0-adagrad", "bound0-sgd", "bound3-audit"],
)
def test_owned_rows_on_host_equal_all_on_device(case: dict) -> None:
    results = spawn_ranks(_run, 2, case, timeout_s=120)
    for r in results:
        dev, host = r["device"], r["host"]
        assert len(dev["outs"]) == len(host["outs"]) == STEPS + 1
        for a, b in zip(dev["outs"], host["outs"], strict=True):
            assert torch.equal(a, b)
        for k in ("ids", "weight", "opt_state"):
            assert torch.equal(dev["sd"][k], host["sd"][k]), k
        assert r["budget"] == -(-r["n_own"] * 5 // 100)  # 5 % of the owned rows
        c = host["counters"]
        assert c["tier_misses"] > 0 and c["tier_evictions"] > 0 and c["tier_written_back"] > 0
        assert c["tier_hits"] > 0 and c["tier_batches"] >= STEPS
        assert "tier_hits" not in dev["counters"]
    if case["audit"]:  # (the audit ran on every step of both tables and found stale reads)
        assert sum(r["host"]["counters"]["rows_mirror_stale_ok"] for r in results) > 0
