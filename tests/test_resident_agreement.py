"""Lockstep ranks agree on holding their samples on the device: a rank whose samples do not fit
(``--data-on-device auto`` decides by each rank's own shard and free memory) makes every rank
stream, since a resident rank replays the whole-step graph and a streaming one steps eagerly,
and the two would not meet at the same collectives (they hung until the process-group
timeout)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks


def _mixed(env: DistEnv, cfg) -> str:  # type: ignore[no-untyped-def]
    from test_whole_step_multi import _factory, interpreter_now

    from hetgmp.train.graphed_multi import MultiRankGraphedStep
    from hetgmp.train.run import build_trainer
    from hetgmp.train.runlog import RunLog

    interpreter_now()
    if env.rank == 1:  # (stands for a rank whose shard exceeds its device budget)
        cfg = dataclasses.replace(cfg, data_on_device="off")
    tr = build_trainer(cfg, env, RunLog(active=False), _factory())
    tr.use_whole_step_graph()
    assert isinstance(tr.run_step, MultiRankGraphedStep)
    tr.fit()
    return tr.data_source


def test_ranks_stream_together_when_one_rank_cannot_hold_its_samples(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    from test_tier_epoch import _skewed
    from test_whole_step_multi import _cfg, _plan

    ds = _skewed(tmp_path / "ds")
    plan = _plan(ds, 2, tmp_path / "part.npz")
    cfg = _cfg(ds.root, plan, optimizer="adagrad", bound=0, kernels="torch", epochs=1)
    got = spawn_ranks(_mixed, 2, cfg, timeout_s=120, start_method="spawn")
    assert "resident" not in got and len(set(got)) == 1, got
