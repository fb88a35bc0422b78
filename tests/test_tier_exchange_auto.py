"""``--exchange auto`` with several ranks' host tier (issue 33): padded where the whole step can
be one CUDA graph (several CUDA ranks, graphs on, collective sync), exact otherwise; and where
the trainer then finds the whole-step flow does not apply (samples not resident), it goes back
to the exact exchange before the first step instead of refusing what the user never asked."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.train.tier_exchange import exchange_of


def test_auto_takes_padded_only_where_the_whole_step_applies() -> None:
    cuda2 = SimpleNamespace(world_size=2, device=torch.device("cuda"), backend="nccl")
    cfg = SimpleNamespace(exchange="auto", rows_on="host", cuda_graphs=True, sync="collective",
                          replies="auto")  # fmt: skip
    assert exchange_of(cfg, cuda2) == "padded"  # type: ignore[arg-type]
    gloo2 = SimpleNamespace(world_size=2, device=torch.device("cuda"), backend="gloo")
    assert exchange_of(SimpleNamespace(**{**vars(cfg), "replies": "all"}), gloo2) == "padded"  # type: ignore[arg-type]
    for change, env in (
        ({}, SimpleNamespace(world_size=1, device=torch.device("cuda"), backend="nccl")),
        ({}, SimpleNamespace(world_size=2, device=torch.device("cpu"), backend="gloo")),
        ({}, gloo2),  # (--replies auto is stale on gloo: padded needs every reply)
        ({"replies": "stale"}, cuda2),
        ({"cuda_graphs": False}, cuda2),
        ({"rows_on": "device"}, cuda2),
        ({"exchange": "exact"}, cuda2),
    ):
        c = SimpleNamespace(**{**vars(cfg), **change})
        assert exchange_of(c, env) == ("exact" if change.get("exchange") else "auto"), (change, env)  # type: ignore[arg-type]
    assert exchange_of(SimpleNamespace(**{**vars(cfg), "sync": "async"}), cuda2) == "auto"  # type: ignore[arg-type]


def _run(env: DistEnv, cfg, padded_first: bool) -> dict:  # type: ignore[no-untyped-def]
    from test_whole_step_multi import _rank, interpreter_now

    from hetgmp.train import run

    interpreter_now()
    if padded_first:  # (what auto gives CUDA ranks; the CPU ranks stand in for them)
        run.exchange_of = lambda c, e: "padded"  # type: ignore[assignment]
    return _rank(env, cfg, False, None)


def _exchanges(env: DistEnv, cfg) -> tuple[str, str, int]:  # type: ignore[no-untyped-def]
    from test_whole_step_multi import _factory, interpreter_now

    from hetgmp.train import run
    from hetgmp.train.runlog import RunLog

    interpreter_now()
    run.exchange_of = lambda c, e: "padded"  # type: ignore[assignment]
    tr = run.build_trainer(cfg, env, RunLog(active=False), _factory())
    built = tr.model.embedding.exchange
    res = tr.fit()
    return built, tr.model.embedding.exchange, int(res["step"])


def _setup(tmp_path: Path):  # type: ignore[no-untyped-def]
    pytest.importorskip("triton")
    from test_tier_epoch import _skewed
    from test_whole_step_multi import _cfg, _plan

    ds = _skewed(tmp_path / "ds")
    plan = _plan(ds, 2, tmp_path / "part.npz")
    return _cfg(ds.root, plan, optimizer="adagrad", bound=0, kernels="torch", epochs=1,
                rows_on="host", cache_budget=0.6, data_on_device="off", exchange="auto")  # fmt: skip


def test_auto_goes_back_to_exact_when_the_samples_are_streamed(tmp_path: Path) -> None:
    """Padded at build (what auto gives CUDA ranks), streamed samples: the run trains (the
    padded exchange with a tier outside the whole-step flow is refused, so it went exact)."""
    got = spawn_ranks(_exchanges, 2, _setup(tmp_path), timeout_s=120, start_method="spawn")
    assert all(g[:2] == ("padded", "exact") and g[2] > 0 for g in got), got


@pytest.mark.slow  # (~16 s: two runs of two spawned ranks)
def test_the_fallback_trains_as_the_exact_exchange(tmp_path: Path) -> None:
    cfg = _setup(tmp_path)
    auto = spawn_ranks(_run, 2, cfg, True, timeout_s=120, start_method="spawn")
    exact = dataclasses.replace(cfg, exchange="exact")
    want = spawn_ranks(_run, 2, exact, False, timeout_s=120, start_method="spawn")
    from test_whole_step_multi import _assert_runs_equal

    _assert_runs_equal(want, auto, counters=False)


def test_rows_on_the_device_keep_the_padded_exchange(tmp_path: Path) -> None:
    """The fallback is the host tier's only: a table with its rows on the device keeps the
    padded exchange auto gave it, whole step or not."""
    cfg = dataclasses.replace(_setup(tmp_path), rows_on="device")
    got = spawn_ranks(_exchanges, 2, cfg, timeout_s=120, start_method="spawn")
    assert all(g[:2] == ("padded", "padded") and g[2] > 0 for g in got), got
