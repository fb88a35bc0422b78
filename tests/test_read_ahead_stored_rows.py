"""Reading one step ahead keeps the rows stored here fresh (hetgmp/embedding/padded/local_now.py):
a batch's gradient reaches its own rows and mirrors at the end of its step and the next step
reads them from the table, so only rows not stored here and peers' pushes come a step late.

The sharp case: a data set whose samples of rank r touch only rows rank r owns (no mirrors, no
rows not stored). There nothing may be stale, so the whole-step graph reading ahead must train
exactly as the strict eager step; with the first version's lag (``STORED_AT_ONCE`` off) every
hot row missed the last step's update and the runs differ."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.config import validate
from hetgmp.partition.plan import Plan, save_plan
from hetgmp.train.config import TrainConfig
from hetgmp.train.graphed_multi import MultiRankGraphedStep
from hetgmp.train.run import build_trainer, distributed_embedding
from hetgmp.train.runlog import RunLog

CARDS = [8, 40, 12]


def _disjoint_dataset(root: Path):
    """400 train samples; sample s belongs to group s % 2 and draws every field from that
    group's half of the field's ids."""
    from hetgmp.data.format import make_fields, write_dataset

    rng = np.random.default_rng(3)
    fields = make_fields(["a", "b", "c"], CARDS)
    offs = np.array([f.offset for f in fields])

    def split(n: int):
        grp = np.arange(n) % 2
        half = np.array(CARDS) // 2
        local = np.stack([rng.integers(0, h, n) for h in half], axis=1) + grp[:, None] * half
        dense = rng.random((n, 2), dtype=np.float32)
        return local + offs, dense, (rng.random(n) < 0.3).astype(np.float32)

    return write_dataset(root, fields, {"train": split(400), "test": split(100)}, num_dense=2)


def _disjoint_plan(ds, path: Path) -> Path:
    """Samples to their group's rank, rows to the group whose half they are in; no mirrors."""
    grp_rows = np.concatenate([np.arange(c) >= c // 2 for c in CARDS]).astype(np.int32)
    dp = (np.arange(len(ds.train)) % 2).astype(np.int32)
    mirrors = [np.zeros(0, np.int64)] * 2
    return save_plan(Plan(dp, grp_rows, mirrors, {"dataset_fingerprint": ds.fingerprint}), path)


def _rank(env: DistEnv, cfg: TrainConfig, whole: bool, at_once: bool) -> dict:
    from hetgmp.embedding.padded import ahead

    ahead.ENABLED, ahead.STORED_AT_ONCE = whole, at_once
    tr = build_trainer(cfg, env, RunLog(active=False), distributed_embedding)
    if whole:
        tr.use_whole_step_graph()
        assert isinstance(tr.run_step, MultiRankGraphedStep)
        tr.run_step.warmup = 1
    res = tr.fit()
    sd = tr.model.embedding.state_dict()
    order = torch.argsort(sd["ids"])
    return {
        "weight": sd["weight"][order], "opt": sd["opt_state"][order] if sd["opt_state"].numel()
        else sd["opt_state"], "ahead": getattr(tr.run_step, "replays_ahead", 0),
        "dense": {k: v.clone() for k, v in tr.model.dense_state_dict().items()},
        "counters": res["embedding_counters"],
    }  # fmt: skip


@pytest.mark.parametrize("optimizer", ["adagrad"])  # (reading ahead is off: a diagnosis)
def test_reading_ahead_reads_stored_rows_fresh(tmp_path: Path, optimizer: str) -> None:
    ds = _disjoint_dataset(tmp_path / "ds")
    plan = _disjoint_plan(ds, tmp_path / "part.npz")
    cfg = validate(TrainConfig(
        dataset=str(ds.root), partition=str(plan), batch_size=20, embed_dim=4, progress=False,
        lr=0.1 if optimizer == "adagrad" else 3.0, dense_optimizer="sgd", dense_lr=0.05, warmup_steps=1, threads=1, val=False,
        epochs=2, store_rate=0.0, replies="all", exchange="padded", data_on_device="on",
        log_every=50, optimizer=optimizer, bound=3,
    ))  # fmt: skip
    strict = spawn_ranks(_rank, 2, cfg, False, True, timeout_s=180)
    ahead = spawn_ranks(_rank, 2, cfg, True, True, timeout_s=180)
    lagged = spawn_ranks(_rank, 2, cfg, True, False, timeout_s=180)
    for s, a, g in zip(strict, ahead, lagged, strict=True):
        assert a["ahead"] >= 10 and a["ahead"] == g["ahead"], (a["ahead"], g["ahead"])
        assert a["counters"]["rows_owned"] > 0 and a["counters"]["rows_remote"] == 0
        torch.testing.assert_close(a["weight"], s["weight"], rtol=0, atol=1e-6)
        torch.testing.assert_close(a["opt"], s["opt"], rtol=0, atol=1e-6)
        for k, v in s["dense"].items():
            torch.testing.assert_close(a["dense"][k], v, rtol=0, atol=1e-6)
    # (the lag the first version had: hot rows missed the last step's update)
    pairs = zip(strict, lagged, strict=True)
    lag = max(float((g["weight"] - s["weight"]).abs().max()) for s, g in pairs)
    assert lag > 1e-4, lag


def _rank_mid_epoch(env: DistEnv, cfg: TrainConfig) -> dict:
    from hetgmp.embedding.padded import ahead

    ahead.ENABLED = True
    tr = build_trainer(cfg, env, RunLog(active=False), distributed_embedding)
    tr.use_whole_step_graph()
    tr.run_step.warmup = 1
    res = tr.fit()  # (ends with a flush: every pending gradient and mirror delta pushed)
    s = tr.model.embedding.store
    return {
        "owned_versions": int(s.version_full[: s.n_own].sum()),
        "pending": int(s.pending_full[: s.n_mir].sum()),
        "ahead": tr.run_step.replays_ahead, "samples": res["samples_seen"],
    }  # fmt: skip


@pytest.mark.parametrize("between", ["nothing", "evaluations", "checkpoints"])
def test_flushes_after_reading_ahead_push_every_count(
    tiny_dataset, tmp_path: Path, between: str
) -> None:
    """A flush (the final one, an evaluation's, a checkpoint's) right after a step that read
    the next batch ahead pushes the last gradient eagerly, from the batch record the graph
    restored. That record once carried the host counts of another batch of its ring slot
    (the one an eager step had primed, or the one the slot's host copy last held: eager steps
    did not write it): an index out of range in the flush on CPU, a device assert on 2 H100s.
    Every id occurrence trained must reach its owner's version count exactly once. (Also: a
    checkpoint directory given as text.)"""
    from test_whole_step_multi import _cfg, _plan

    plan = _plan(tiny_dataset, 2, tmp_path / "part.npz")
    more = {
        "nothing": {"iter": 13},
        "evaluations": {"iter": 22, "val": True, "eval_every": 4},
        "checkpoints": {"iter": 22, "checkpoint_dir": str(tmp_path / "ck"), "checkpoint_every": 5},
    }[between]
    cfg = _cfg(tiny_dataset.root, plan, optimizer="adagrad", bound=3, **more)
    got = spawn_ranks(_rank_mid_epoch, 2, cfg, timeout_s=180)
    assert all(r["ahead"] > 0 for r in got), got
    assert all(r["pending"] == 0 for r in got), got
    fields = 3  # (tiny_dataset)
    assert sum(r["owned_versions"] for r in got) == got[0]["samples"] * fields, got
