"""``hetgmp train --sync async`` (issue 17): the trainer on spawned ranks against ``--sync
collective``, the options' refusals, and a real ``mpirun -np 4`` launch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_train_dist import ROOT, _cfg, _ckpt_state, _train_rank, _uneven_plan

from hetgmp.comm.spawn import spawn_ranks
from hetgmp.config import ConfigError

pytest.importorskip("zmq")


def test_trainer_async_bound0_maxlag0_equals_collective(tiny_dataset, tmp_path, capfd) -> None:
    """SGD rows and dense layers: the same checkpoint to float tolerance (and the log says
    that --max-lag 0 keeps the ranks in step)."""
    plan = _uneven_plan(tiny_dataset, 2, tmp_path / "part.npz")
    states = {}
    for sync in ("collective", "async"):
        extra = {"async_host": "127.0.0.1"} if sync == "async" else {}
        cfg = _cfg(
            tiny_dataset.root, model="wdl", iter=8, partition=plan, store_rate=0.5, bound=0,
            optimizer="sgd", checkpoint_dir=tmp_path / sync, sync=sync, device="cpu", **extra,
        )  # fmt: skip
        res = spawn_ranks(_train_rank, 2, cfg, timeout_s=180)
        assert res[0]["embedding"]["mirror_hit"] > 0  # mirrors were really used
        hint = "--max-lag 0 keeps every rank at the same step" in capfd.readouterr().out
        assert hint == (sync == "async")
        states[sync] = _ckpt_state(tmp_path / sync)
    (d0, w0, i0), (d1, w1, i1) = states["collective"], states["async"]
    assert torch.equal(i0, i1)
    torch.testing.assert_close(w1, w0, rtol=0, atol=1e-6)
    for k in d0:
        torch.testing.assert_close(d1[k], d0[k], rtol=0, atol=1e-6, msg=k)


def test_async_options_are_checked(tiny_dataset) -> None:
    with pytest.raises(ConfigError, match="--max-lag applies to --sync async only"):
        _cfg(tiny_dataset.root, max_lag=2)
    with pytest.raises(ConfigError, match="--dense-sync-every applies to --sync async only"):
        _cfg(tiny_dataset.root, dense_sync_every=4)
    with pytest.raises(ConfigError, match="--exchange padded needs"):
        _cfg(tiny_dataset.root, sync="async", exchange="padded")


@pytest.mark.mpi
def test_mpirun_four_ranks_async(tiny_dataset, tmp_path) -> None:
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    env = dict(
        os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1",
    )  # fmt: skip
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    out = tmp_path / "res.json"
    cmd = [
        str(mpirun), "-np", "4", "--oversubscribe", sys.executable,
        str(ROOT / "examples" / "hetuctr.py"), "--dataset", str(tiny_dataset.root),
        "--batch_size", "16", "--embed_dim", "4", "--log_every", "3", "--no-progress",
        "--threads", "1", "--device", "cpu", "--iter", "6", "--output", str(out),
        "--sync", "async", "--max-lag", "2", "--bound", "2", "--dense-sync-every", "2",
        "--async-host", "127.0.0.1", "--timeout", "60",
    ]  # fmt: skip
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, f"mpirun exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr}"
    assert "launcher mpirun, 4 rank(s)" in p.stdout
    assert "sync async (--max-lag 2)" in p.stdout
    # --max-lag 2: unequal step counts until the budget of --iter 6 global steps' samples
    assert re.search(r"^EVAL \d+: val_loss \S+ val_acc \S+ val_auc \S+", p.stdout, re.M)
    res = json.loads(out.read_text())
    assert res["async"]["budget"] == 6 * 4 * 16
    assert 6 * 4 * 16 <= res["samples_seen"] < 6 * 4 * 16 + 4 * 16


def test_async_hints_say_what_the_settings_mean() -> None:
    """The start of a run says what --sync async's settings mean: --max-lag 0 keeps lockstep,
    and on GPUs lockstep is usually faster (a CUDA device object, no GPU needed: only the
    log lines are looked at)."""
    import io
    from types import SimpleNamespace

    from hetgmp.comm.env import DistEnv
    from hetgmp.train.config import TrainConfig
    from hetgmp.train.run import _log_embedding
    from hetgmp.train.runlog import RunLog

    emb = SimpleNamespace(kernels="torch", replies="stale", exchange="exact", sync="async")

    def said(max_lag: int, device: str, world: int = 2) -> str:
        out = io.StringIO()
        cfg = TrainConfig(sync="async", max_lag=max_lag)
        env = DistEnv(rank=0, world_size=world, device=torch.device(device))
        _log_embedding(RunLog(active=True, stream=out, progress=False), cfg, env, emb)
        return out.getvalue()

    assert "--max-lag 0 keeps every rank" in said(0, "cpu")
    assert "--max-lag 0 keeps" not in said(100, "cpu") and "async on GPUs" not in said(100, "cpu")
    assert "async on GPUs" in said(100, "cuda") and "When async pays" in said(100, "cuda")
    assert said(100, "cuda", world=1).count("\n") == 1  # (one rank: the settings line only)
