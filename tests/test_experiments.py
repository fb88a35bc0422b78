"""Experiments: a tiny store-rate sweep through real mpirun (CSV, PNG, markdown, resume), the run
table, aggregation, and the cost model's prediction for a run."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from hetgmp.config import from_namespace
from hetgmp.experiments import launch
from hetgmp.experiments.launch import RunSpec, find_mpirun, train_command
from hetgmp.experiments.predict import bytes_per_fetch, predict_fetches
from hetgmp.experiments.sweep import SweepOptions, ensure_plan
from hetgmp.experiments.table import RunTable, aggregate
from hetgmp.train.cli import add_train_arguments
from hetgmp.train.config import TrainConfig

OPTIMIZER_FIELDS = ("optimizer", "lr", "adagrad_init", "dense_optimizer", "dense_lr")

MPIRUN = Path(sys.executable).parent / "mpirun"


@pytest.fixture(scope="module")
def tiny_criteo(tmp_path_factory) -> Path:
    from hetgmp.data.generate import generate_criteo_like

    out = tmp_path_factory.mktemp("exp") / "tiny"
    generate_criteo_like(out, num_samples=2000, scale=0.0005, seed=1, progress=False)
    return out


def _opts(data: Path, out: Path, **kw) -> SweepOptions:
    base = dict(data=data, out=out, ranks=2, batch_size=32, embed_dim=4, iters=4, progress=False)
    return SweepOptions(**{**base, **kw})


def test_run_table_roundtrip_and_aggregate(tmp_path) -> None:
    t = RunTable(tmp_path / "t.csv")
    t.add({"key": "a", "store_rate": 0.0, "val_auc": 0.6, "note": "x"})
    t.add({"key": "b", "store_rate": 0.0, "val_auc": 0.7, "extra": 3})
    t.add({"key": "b", "store_rate": 0.0, "val_auc": 0.8, "extra": 3})  # replaces b
    again = RunTable(tmp_path / "t.csv")
    assert [r["key"] for r in again.rows] == ["a", "b"] and again.has("b")
    assert again.rows[1]["val_auc"] == 0.8 and again.rows[0]["extra"] == ""
    (agg,) = aggregate(again.rows, ["store_rate"], ["val_auc"])
    assert agg["runs"] == 2 and agg["val_auc"] == pytest.approx(0.7)
    assert agg["val_auc_std"] == pytest.approx(np.std([0.6, 0.8], ddof=1))
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a run table"):
        RunTable(tmp_path / "bad.csv")


def test_spec_key_covers_every_parameter() -> None:
    a = RunSpec(experiment="x", dataset="d", ranks=2)
    assert a.key == RunSpec(experiment="x", dataset="d", ranks=2).key
    assert a.key != RunSpec(experiment="x", dataset="d", ranks=2, seed=1).key
    assert a.key != RunSpec(experiment="x", dataset="d", ranks=2, store_rate=0.01).key


def _train_config_of(cmd: list[str]) -> TrainConfig:
    """The :class:`TrainConfig` that ``hetgmp train`` builds from a sweep's command line."""
    assert cmd[cmd.index("-m") + 1 : cmd.index("-m") + 3] == ["hetgmp", "train"]
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return from_namespace(TrainConfig, parser.parse_args(cmd[cmd.index("train") + 1 :]))


def test_optimizer_defaults_are_train_defaults(monkeypatch, tmp_path) -> None:
    """A sweep with default options trains with ``hetgmp train``'s optimizers, and says so."""
    train = TrainConfig()
    for name in OPTIMIZER_FIELDS:
        assert SweepOptions.__dataclass_fields__[name].default == getattr(train, name), name
        if name != "dense_lr":  # a spec holds the resolved dense lr; None: train's rule
            assert RunSpec.__dataclass_fields__[name].default == getattr(train, name), name
    # the command-line defaults too (the parser the CLI builds)
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    from hetgmp.experiments.cli import add_store_rate

    add_store_rate(sub)
    args = parser.parse_args(["store-rate", "--data", "d", "--out", "o"])
    opts = from_namespace(SweepOptions, args)
    assert {n: getattr(opts, n) for n in OPTIMIZER_FIELDS} == {
        n: getattr(train, n) for n in OPTIMIZER_FIELDS
    }
    spec = opts.base_spec("store_rate")
    assert spec.dense_lr == train.effective_dense_lr  # resolved: the CSV holds the value used
    assert RunSpec(experiment="x", dataset="d", ranks=2).effective_dense_lr == (
        train.effective_dense_lr
    )
    monkeypatch.setattr(launch, "find_mpirun", lambda: "mpirun")
    cmd = train_command(spec, tmp_path)
    got = _train_config_of(cmd)
    for name in ("optimizer", "lr", "adagrad_init", "dense_optimizer", "effective_dense_lr"):
        assert getattr(got, name) == getattr(train, name), name
    assert "--adagrad-init" in cmd and cmd[cmd.index("--replies") + 1] == "stale"
    assert "adagrad lr 0.05 (initial accumulator 1e-07)" in opts.optimizers


def test_old_defaults_pass_through_explicitly(monkeypatch, tmp_path) -> None:
    """The pre-change defaults (SGD 0.01 both) and the published runs' settings still launch."""
    monkeypatch.setattr(launch, "find_mpirun", lambda: "mpirun")
    old = SweepOptions(
        data=tmp_path, out=tmp_path, optimizer="sgd", lr=0.01, dense_optimizer="sgd", dense_lr=0.01
    )
    cfg = _train_config_of(train_command(old.base_spec("x"), tmp_path))
    assert (cfg.optimizer, cfg.lr, cfg.dense_optimizer, cfg.effective_dense_lr) == (
        "sgd", 0.01, "sgd", 0.01,
    )  # fmt: skip
    sgd_lr = SweepOptions(data=tmp_path, out=tmp_path, optimizer="sgd", dense_optimizer="sgd")
    assert sgd_lr.base_spec("x").dense_lr == sgd_lr.lr  # train's rule: dense lr = --lr unless adam
    pub = SweepOptions(
        data=tmp_path, out=tmp_path, optimizer="adagrad", lr=0.05, adagrad_init=0.0,
        dense_optimizer="adam", dense_lr=0.003,
    )  # fmt: skip
    spec = pub.base_spec("x")
    cfg = _train_config_of(train_command(spec, tmp_path))
    assert (cfg.adagrad_init, cfg.lr, cfg.effective_dense_lr) == (0.0, 0.05, 0.003)
    assert spec.key != SweepOptions(data=tmp_path, out=tmp_path).base_spec("x").key


def test_prediction_scales_with_batch_and_mirrors(tiny_criteo, tmp_path) -> None:
    plan = ensure_plan(tiny_criteo, 2, tmp_path, method="hash", batch_size=32)
    small = predict_fetches(tiny_criteo, plan, batch_size=32, store_rates=(0.0, 0.05))
    big = predict_fetches(tiny_criteo, plan, batch_size=1024)
    assert 0 < small["fetches_per_step"] < big["fetches_per_step"]
    assert small["with_mirrors"][0.0] == pytest.approx(small["fetches_per_step"])
    assert small["with_mirrors"][0.05] < small["with_mirrors"][0.0]
    assert bytes_per_fetch(16) == 32 + 8 * 16 and bytes_per_fetch(16, 1) == 164  # measured


@pytest.mark.mpi
def test_store_rate_sweep_two_runs_then_resume(tiny_criteo, tmp_path, monkeypatch) -> None:
    if not MPIRUN.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    # (the runs' ranks inherit it: one OpenMP thread each, 2 ranks on a 2-core box)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    from hetgmp.experiments.store_rate import run_store_rate

    assert find_mpirun() == str(MPIRUN)
    opts = _opts(tiny_criteo, tmp_path / "out")
    errors, path = run_store_rate(opts, store_rates=(0.0, 0.02), bound=10)
    assert errors == []
    rows = list(csv.DictReader(path.open()))
    assert sorted(float(r["store_rate"]) for r in rows) == [0.0, 0.02]
    for r in rows:
        assert r["status"] == "ok" and r["ranks"] == "2" and r["seed"] == "0"
        assert 0.0 <= float(r["val_auc"]) <= 1.0 and float(r["val_logloss"]) > 0
        assert float(r["bytes_per_sample"]) > 0 and float(r["table_mb_max"]) > 0
        assert float(r["peak_rss_mb_max"]) > 0 and json.loads(r["auc_curve"])
        assert float(r["predicted_fetches_per_step"]) >= 0
    by_rate = {float(r["store_rate"]): r for r in rows}
    assert float(by_rate[0.0]["mirror_hit"]) == 0.0 < float(by_rate[0.02]["mirror_hit"])
    png = tmp_path / "out" / "store_rate.png"
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "out" / "store_rate.md").read_text()
    assert "| 0.02 |" in md and "store_rate.png" in md
    before = path.read_text()
    out = io.StringIO()
    from hetgmp.experiments import sweep

    specs = [
        opts.base_spec("store_rate", plan=r["plan"], method="plan", bound=10, store_rate=s)
        for r, s in zip(rows, (float(r["store_rate"]) for r in rows), strict=True)
    ]
    assert sweep.run_sweep(specs, RunTable(path), tmp_path / "runs", opts=opts, stream=out) == []
    assert "2 runs, 2 already in" in out.getvalue() and "0 to run" in out.getvalue()
    errors, _ = run_store_rate(opts, store_rates=(0.0, 0.02), bound=10)
    assert errors == [] and path.read_text() == before  # nothing re-run


@pytest.mark.slow
@pytest.mark.mpi
def test_partition_compare_prediction_matches_runtime(tiny_criteo, tmp_path) -> None:
    """At the run's batch size, predicted remote rows/step match the runtime within 20 %."""
    if not MPIRUN.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    from hetgmp.experiments.partition_compare import run_partition_compare

    opts = _opts(tiny_criteo, tmp_path / "out", iters=12)
    errors, path = run_partition_compare(opts, methods=("hash", "metis+refine"), parts=(2,))
    assert errors == []
    rows = list(csv.DictReader(path.open()))
    assert {r["method"] for r in rows} == {"hash", "metis+refine"}
    for r in rows:
        assert 0.8 < float(r["measured_over_predicted"]) < 1.2, r
        assert float(r["predicted_at_default_batch"]) > float(r["predicted_fetches_per_step"])
    assert (tmp_path / "out" / "partition.png").stat().st_size > 1000
