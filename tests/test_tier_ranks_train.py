"""The CLI's training (``train``) on two gloo ranks with ``--rows-on host`` (owned rows on the
host tier, hetgmp/embedding/tier_owned.py): at bound 0 with a 5 % cache it equals the same run
all on the device exactly (rows, optimizer state, dense layers, losses); with a plan and bound
100 the results' tier counters are each rank's added up; and a cache that starts with the
training split's most used rows (``--cache-warm counts``, the default) hits more in the first
epoch than a cold one on a skewed set."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_tier_train import checkpoint_rows, write_skewed

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.config import validate
from hetgmp.data.format import open_dataset
from hetgmp.partition.plan import Plan, save_plan
from hetgmp.train.config import TrainConfig
from hetgmp.train.run import train

CARDS = [2000, 5000, 3000]  # 10,000 rows: a rank owns ~5,000, a 5 % cache holds ~250


@pytest.fixture
def skewed(tmp_path: Path) -> Path:
    """Hot and cold ids (a fourth power of a uniform), so the cache hits and misses."""
    return write_skewed(tmp_path / "skewed", CARDS, seed=7, power=4, n_train=640, n_test=64)


def _cfg(root: Path, **kw: object) -> TrainConfig:
    base = dict(dataset=str(root), batch_size=16, eval_batch_size=16, embed_dim=4, epochs=1,
                log_every=10, progress=False, threads=1, lr=0.05, dense_optimizer="adam",
                val=True)  # fmt: skip
    return validate(TrainConfig(**{**base, **kw}))


def _train_each(env: DistEnv, cfgs: list[TrainConfig]) -> list[dict]:
    return [train(cfg, env) for cfg in cfgs]


def _losses(path: Path) -> list[float]:
    recs = [json.loads(ln) for ln in path.read_text().splitlines()]
    return [r["loss"] for r in recs if "loss" in r and "val_auc" not in r]


def _plan(root: Path, path: Path) -> Path:
    ds = open_dataset(root)
    rng = np.random.default_rng(3)
    n, r = len(ds.train), ds.meta.num_embeddings
    ep = rng.integers(0, 2, r).astype(np.int32)
    mirrors = [rng.permutation(np.flatnonzero(ep != w)).astype(np.int64) for w in range(2)]
    plan = Plan(rng.integers(0, 2, n).astype(np.int32), ep, mirrors,
                {"dataset_fingerprint": ds.fingerprint})  # fmt: skip
    return save_plan(plan, path)


def test_two_ranks_host_rows(skewed: Path, tmp_path: Path) -> None:
    tier = dict(rows_on="host", cache_budget=0.05)
    plan = _plan(skewed, tmp_path / "part.npz")
    cfgs = [
        # bound 0: all on the device, then the host tier at 5 %
        _cfg(skewed, checkpoint_dir=tmp_path / "dev", log_json=tmp_path / "dev.jsonl"),
        _cfg(skewed, checkpoint_dir=tmp_path / "host", log_json=tmp_path / "host.jsonl", **tier),
        # a plan with mirrors at bound 100
        _cfg(skewed, partition=plan, store_rate=0.05, bound=100, **tier),
        # a cold cache against the warm one above (one epoch)
        _cfg(skewed, cache_warm="cold", **tier),
    ]
    ranks = spawn_ranks(_train_each, 2, cfgs, timeout_s=150)
    dev, host, planned, cold = ranks[0]
    assert host["val_loss"] == dev["val_loss"] and host["val_auc"] == dev["val_auc"]
    assert _losses(tmp_path / "host.jsonl") == _losses(tmp_path / "dev.jsonl")
    assert len(_losses(tmp_path / "dev.jsonl")) >= 2
    (dd, dw, ds), (hd, hw, hs) = (
        checkpoint_rows(tmp_path / "dev"),
        checkpoint_rows(tmp_path / "host"),
    )
    assert set(dd) == set(hd) and all(torch.equal(dd[k], hd[k]) for k in dd)
    assert torch.equal(dw, hw) and torch.equal(ds, hs)
    t = host["host_tier"]
    assert t["misses"] > 0 and t["evictions"] > 0 and t["written_back"] > 0
    assert t["table_rows"] == sum(CARDS) and len(t["ranks"]) == 2
    # a plan, bound 100: every tier figure of the results is the ranks' added up
    p = planned["host_tier"]
    assert planned["embedding"]["mirror_hit"] > 0
    for k in ("hits", "misses", "evictions", "written_back", "steps", "cache_rows", "table_rows",
              "host_bytes", "device_bytes", "warm_rows"):  # fmt: skip
        assert p[k] == sum(r[k] for r in p["ranks"]), k
    assert all(r["hits"] > 0 and r["misses"] > 0 for r in p["ranks"])
    row_bytes = 4 * (4 + 1) + 8  # dim 4, Adagrad's state, the owner's version
    assert p["bytes_h2d_per_step"] * p["steps"] == p["misses"] * row_bytes
    # warm (the default: the training split's counts) against cold, first epoch
    assert t["warm_rows"] > 0 and cold["host_tier"]["warm_rows"] == 0
    assert t["hit_rate"] > cold["host_tier"]["hit_rate"], (t["hit_rate"], cold["host_tier"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_host_tier_on_one_gpu(tmp_path: Path) -> None:
    """``--rows-on host`` at a 10 % cache on one GPU equals all on the device and prints both
    speeds (tests/gpu_tier_check.py)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, str(root / "tests" / "gpu_tier_check.py"), str(tmp_path / "data")]
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert got.returncode == 0 and "TIER CHECK OK" in got.stdout, got.stdout + got.stderr
    assert "samples/s" in got.stdout
