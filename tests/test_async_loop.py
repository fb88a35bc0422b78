"""``--sync async`` with unequal step counts (issue 17): the global sample budget, the dense
parameter server, ``--straggle``, and no hang when a rank has no samples or fails (row-wise
Adagrad at bound 0 / max-lag 0 is in test_async.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from test_train_dist import _cfg, _train_rank

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.config import ConfigError
from hetgmp.embedding import DistributedEmbedding
from hetgmp.embedding.rowservice import AsyncConfig
from hetgmp.partition.plan import Plan, save_plan
from hetgmp.train.async_loop import steady_rates
from hetgmp.train.straggle import Straggle, Straggler, parse_straggle

pytest.importorskip("zmq")

BATCH = 32


def _async_cfg(root, **kw):
    base = dict(sync="async", device="cpu", async_host="127.0.0.1", max_lag=-1, timeout_s=30.0)
    base.update(kw)
    return _cfg(root, batch_size=BATCH, **base)


# ---------------------------------------------------------------- the budget stop rule
@pytest.mark.parametrize("straggle", ["1:4", "1:10"])
def test_budget_fast_rank_does_more_steps(tiny_dataset, straggle: str) -> None:
    """Rank 1 straggles 4x (10x): rank 0 does more steps; all ranks together train the
    budget (2 epochs x 400 samples), at most one batch per rank more (a straggler tells its
    commits at once: rank 0 trains many batches during one of its steps)."""
    cfg = _async_cfg(tiny_dataset.root, epochs=2, straggle=straggle)
    res = spawn_ranks(_train_rank, 2, cfg, timeout_s=120)
    a = res[0]["async"]
    steps, samples = a["steps_per_rank"], a["samples_per_rank"]
    assert a["budget"] == 800
    assert steps[0] > 1.5 * steps[1], steps
    assert sum(samples) == res[0]["samples_seen"]
    assert 800 <= sum(samples) < 800 + 2 * BATCH, samples
    assert res[0]["step"] == max(steps)
    assert a["dense_exchanges"] >= steps[0]  # (every step, and the final push and pull)
    # the speed: the ranks' rates after their warm-up steps, side by side
    rates = a["speed_per_rank"]
    assert res[0]["warmup_steps"] == 1 and rates[0] > 1.5 * rates[1] and rates[0] > 0, rates
    assert res[0]["speed"] == pytest.approx(sum(rates))
    assert res[0]["warmup_speed"] is not None


@pytest.mark.parametrize("max_lag", [2, -1])
def test_push_and_clock_ride_on_the_reads(tiny_dataset, max_lag: int) -> None:
    """Under --max-lag != 0 a step sends each owner one message (push, clock and read), where
    it used to send a push, three clock messages (one with the commit's samples) and a read;
    commits are told at once only near the budget: the services count what they receive."""
    cfg = _async_cfg(tiny_dataset.root, epochs=4, max_lag=max_lag, val=False)
    res = spawn_ranks(_train_rank, 2, cfg, timeout_s=120)
    per_step = res[0]["async"]["messages_per_peer_step"]
    for got in per_step:  # (the counts include the end: the flush, the meetings)
        assert got.get("push", 0) == 0, per_step  # (every step reads from its peer)
        assert 0.95 <= got["read"] <= 1.15, per_step
        # (commits are told at once only near the budget, which depends on the ranks' relative
        # speed on a shared box: under one a step, where it used to be three)
        assert got["clock"] < 1.0, per_step


def test_steady_rates() -> None:
    assert steady_rates([(2.0, 100, 0.1), (4.0, 100, 0.0)]) == [50.0, 25.0]
    assert steady_rates([(2.0, 100, 0.1), None]) is None  # (a rank never past its warm-up)
    assert steady_rates([(0.0, 0, 0.0), (1.0, 5, 0.0)]) is None


def test_a_rank_waiting_at_the_lag_cap_is_told_how_to_lift_it(tiny_dataset, tmp_path) -> None:
    """Rank 1 straggles 4x under --max-lag 1: rank 0 waits at the cap for much of its time,
    the results say how much per rank, and the log says --max-lag -1 lifts the cap; without
    a cap nobody waits and nothing is said."""
    import json

    got = {}
    for lag in (1, -1):
        log = tmp_path / f"log{lag}.jsonl"
        cfg = _async_cfg(tiny_dataset.root, epochs=2, straggle="1:4", max_lag=lag, log_json=log)
        a = spawn_ranks(_train_rank, 2, cfg, timeout_s=120)[0]["async"]
        infos = [json.loads(x) for x in log.read_text().splitlines()]
        hints = [r["message"] for r in infos if "--max-lag -1 lifts" in r.get("message", "")]
        got[lag] = (a["clock_wait_share_per_rank"], hints)
        fast = a["phase_ms_per_step"][0]  # (its waits at the cap are no compute)
        assert fast["compute"] + fast["clock_wait"] <= fast["loop"] + 0.01, fast
        for ph in a["phase_ms_per_step"]:  # (waits for answers: inside the exchanges' time)
            assert 0 < ph["peer_wait"] < ph["read"] + ph["push"] + 0.1, ph
            assert 0 <= ph["dense_wait"] < ph["dense"] + 0.5, ph
    shares, hints = got[1]
    assert shares[0] > 0.2 > shares[1], shares  # (the fast rank waits, the straggler not)
    assert len(hints) == 1 and "rank 0" in hints[0] and "--max-lag 1 cap" in hints[0]
    assert got[-1][0][0] < 0.05 and got[-1][1] == [], got[-1]


def test_work_stealing_trains_each_batch_of_an_epoch_once(tiny_dataset) -> None:
    """Rank 1 straggles 4x: rank 0 takes the unclaimed batches of rank 1's shard (claimed
    through rank 1's service), so both epochs train every batch of both shards exactly once
    (without stealing rank 0 would cycle its own shard and rank 1's would be trained less)."""
    cfg = _async_cfg(tiny_dataset.root, epochs=2, straggle="1:4")
    res = spawn_ranks(_train_rank, 2, cfg, timeout_s=120)
    a = res[0]["async"]
    assert a["work_stealing"]
    assert a["stolen_per_rank"][0] > 0, a
    assert a["stolen_per_rank"] == a["claimed_from_per_rank"][::-1], a  # (every claim a step)
    cov = a["coverage"]
    for e in (0, 1):  # (the budget is exactly 2 epochs; a few batches may spill into a third)
        i = cov["epochs"].index(e)
        assert cov["missing"][i] == 0 and cov["repeated"][i] == 0, cov
    assert sum(a["samples_per_rank"]) < 800 + 2 * BATCH
    off = spawn_ranks(_train_rank, 2, _async_cfg(tiny_dataset.root, epochs=2, straggle="1:4",
                                                 work_stealing=False), timeout_s=120)  # fmt: skip
    assert not off[0]["async"]["work_stealing"] and off[0]["async"]["coverage"] is None


def _no_samples_plan(ds, path):
    """Every training sample on rank 0; rank 1 owns rows but has nothing to train on."""
    rng = np.random.default_rng(1)
    n, r = len(ds.train), ds.meta.num_embeddings
    ep = rng.integers(0, 2, r).astype(np.int32)
    meta = {"dataset_fingerprint": ds.fingerprint}
    return save_plan(Plan(np.zeros(n, np.int32), ep, [np.zeros(0, np.int64)] * 2, meta), path)


def test_rank_without_samples_does_not_hang(tiny_dataset, tmp_path) -> None:
    plan = _no_samples_plan(tiny_dataset, tmp_path / "part.npz")
    cfg = _async_cfg(tiny_dataset.root, epochs=1, partition=plan, max_lag=2, val=True)
    t0 = time.monotonic()
    res = spawn_ranks(_train_rank, 2, cfg, timeout_s=120)
    a = res[0]["async"]
    assert a["steps_per_rank"][1] == 0 and a["samples_per_rank"][1] == 0
    assert a["speed_per_rank"] is None and res[0]["warmup_steps"] == 0  # (no steady rate)
    assert 400 <= a["samples_per_rank"][0] < 400 + BATCH
    assert "val_auc" in res[0] and time.monotonic() - t0 < 90


def _fails_at_step_three(env: DistEnv, cfg) -> dict:
    """Rank 1's training step raises at its third call (fault injection for the test)."""
    from hetgmp.train import step as step_mod

    if env.rank == 1:
        real, calls = step_mod.TrainStep.__call__, [0]

        def failing(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
            calls[0] += 1
            if calls[0] == 3:
                raise RuntimeError("rank 1 simulated crash")
            return real(self, *a, **k)

        step_mod.TrainStep.__call__ = failing
    return _train_rank(env, cfg)


def test_failing_rank_gives_a_clear_error(tiny_dataset) -> None:
    cfg = _async_cfg(tiny_dataset.root, epochs=3, max_lag=1, timeout_s=8.0)
    t0 = time.monotonic()
    out = spawn_ranks(
        _fails_at_step_three, 2, cfg, timeout_s=90, collective_timeout_s=15, raise_on_error=False
    )
    assert out[1].status == "error" and "simulated crash" in out[1].message
    assert out[0].status == "error" and "rank 1" in out[0].message, out[0]
    assert time.monotonic() - t0 < 60


# ---------------------------------------------------------------- the dense parameter server
def _dense_rule(env: DistEnv) -> dict:
    from hetgmp.train.dense_server import DenseServer

    emb = DistributedEmbedding(
        40, 4, env, sync="async", async_config=AsyncConfig(max_lag=-1, host="127.0.0.1")
    )
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.ones(2, 2))]
    server = DenseServer(env, params, emb.async_engine, every=2)
    with torch.no_grad():
        for p in params:
            p.add_(float(env.rank + 1))  # this rank's change: rank + 1 everywhere
    server.after_step()  # 1 of every 2: no exchange yet
    before = server.exchanges
    server.finish()  # push the rest, meet, pull
    out = {
        "before": before,
        "after": server.exchanges,
        "values": [p.detach().clone() for p in params],
    }
    emb.close()
    return out


def _dense_all(env: DistEnv) -> tuple:
    """The three dense-server runs below, one after another in one spawn."""
    return _dense_rule(env), _dense_overlapped(env), _dense_random(env)


def test_dense_server_rule_overlap_and_same_bits() -> None:
    """(one spawn, three runs: starting the ranks costs more than the runs)"""
    ranks = spawn_ranks(_dense_all, 2, timeout_s=90)
    # served value = start + the mean of the ranks' deltas (1 and 2: +1.5), on every rank
    for r, _, _ in ranks:
        assert r["before"] == 0 and r["after"] == 2
        torch.testing.assert_close(r["values"][0], torch.full((3,), 1.5))
        torch.testing.assert_close(r["values"][1], torch.full((2, 2), 2.5))
    # 7 steps of +1 (rank 0) and +2 (rank 1): the final value is 7 x 1.5 everywhere, although
    # each rank took every answer one exchange late (its own progress meanwhile kept)
    for _, r, _ in ranks:
        assert r["exchanges"] == 6 + 2 + 1  # (6 taken during the run, finish: the 7th, 2 more)
        for v in r["values"]:
            torch.testing.assert_close(v, torch.full_like(v, 10.5))
    # after finish every rank evaluates and saves the same dense model, bit for bit (random
    # changes, unequal step counts, overlapped exchanges)
    (_, _, r0), (_, _, r1) = ranks
    for a, b in zip(r0, r1, strict=True):
        assert torch.equal(a, b)


def _dense_overlapped(env: DistEnv) -> dict:
    """Every step each rank adds ``rank + 1`` to its copy and exchanges (every=1, overlapped):
    nothing is lost or counted twice when the answers arrive a step late."""
    from hetgmp.train.dense_server import DenseServer

    emb = DistributedEmbedding(
        40, 4, env, sync="async", async_config=AsyncConfig(max_lag=-1, host="127.0.0.1")
    )
    params = [torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(3, 2))]
    server = DenseServer(env, params, emb.async_engine, every=1)
    for _ in range(7):
        with torch.no_grad():
            for p in params:
                p.add_(float(env.rank + 1))
        server.after_step()
        assert server.inflight is not None  # (sent, taken at the next exchange)
    server.finish()
    out = {"values": [p.detach().clone() for p in params], "exchanges": server.exchanges}
    emb.close()
    return out


def _dense_random(env: DistEnv) -> list[torch.Tensor]:
    """Random changes (no exact float sums), unequal step counts, overlapped exchanges."""
    from hetgmp.train.dense_server import DenseServer

    emb = DistributedEmbedding(
        40, 4, env, sync="async", async_config=AsyncConfig(max_lag=-1, host="127.0.0.1")
    )
    gen = torch.Generator().manual_seed(env.rank)
    params = [
        torch.nn.Parameter(torch.randn(7, generator=gen)),
        torch.nn.Parameter(torch.randn(4, 3, generator=gen)),
    ]
    server = DenseServer(env, params, emb.async_engine, every=1)
    for _ in range(5 + 3 * env.rank):
        with torch.no_grad():
            for p in params:
                p.add_(torch.randn(p.shape, generator=gen) * 1e-3)
        server.after_step()
    server.finish()
    out = [p.detach().clone() for p in params]
    emb.close()
    return out


def test_dense_buffer_is_the_parameters_flat_storage() -> None:
    """The server snapshots and updates the parameters through one flat buffer: the buffer
    the parameters already share (FlatAdam's), or one they are moved into."""
    from hetgmp.train.dense_server import _flat_buffer
    from hetgmp.train.flat_adam import flatten_parameters

    ps = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))]
    shared = flatten_parameters(ps)
    assert _flat_buffer(ps).data_ptr() == shared.data_ptr()
    loose = [torch.nn.Parameter(torch.randn(2, 2)), torch.nn.Parameter(torch.randn(3))]
    before = torch.cat([p.detach().reshape(-1) for p in loose])
    flat = _flat_buffer(loose)
    assert torch.equal(flat, before)
    flat.add_(1.0)  # (the parameters are views of it now)
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in loose]), before + 1)
    with pytest.raises(ValueError, match="float32"):
        _flat_buffer([torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))])


# ---------------------------------------------------------------- --straggle
def test_straggle_parsing_and_refusals(tiny_dataset) -> None:
    assert parse_straggle("") is None
    assert parse_straggle("1:2") == Straggle(1, 2.0, "sleep")
    assert parse_straggle("0:1.5:spin") == Straggle(0, 1.5, "spin")
    for bad in ("1", "a:2", "1:x", "-1:2", "1:0.5", "1:inf", "1:2:nap", "1:2:spin:3"):
        with pytest.raises(ValueError, match="expected RANK:FACTOR"):
            parse_straggle(bad)
        with pytest.raises(ConfigError, match="straggle"):
            _cfg(tiny_dataset.root, straggle=bad)
    with pytest.raises(ValueError, match="no rank 4 in a run of 2"):
        Straggler(Straggle(4, 2.0), 0, 2, torch.device("cpu"))


def test_straggler_waits_factor_minus_one_step_times() -> None:
    s = Straggler(Straggle(0, 3.0), 0, 2, torch.device("cpu"))
    for _ in range(3):
        s.begin()
        time.sleep(0.02)
        t0 = time.perf_counter()
        s.end()
        assert time.perf_counter() - t0 >= 0.035  # (3 - 1) x ~0.02 s
    idle = Straggler(Straggle(0, 3.0), 1, 2, torch.device("cpu"))  # another rank: no wait
    idle.begin()
    idle.end()
    assert idle.waited_s == 0.0


def test_spinning_straggler_leaves_the_gil_to_other_threads() -> None:
    """The spin keeps the core busy but, like a slow torch step, not the GIL: the rank's async
    row service thread must keep answering peers meanwhile (a Python busy loop starved it and
    coupled every peer to the straggler)."""
    import threading

    s = Straggler(Straggle(0, 5.0, "spin"), 0, 2, torch.device("cpu"))
    ticks, stop = [], threading.Event()

    def service() -> None:  # (stands for the service thread: needs the GIL to run at all)
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    s.begin()
    time.sleep(0.05)
    th = threading.Thread(target=service)
    th.start()
    t0 = time.perf_counter()
    s.end()  # spins ~0.2 s
    spun = time.perf_counter() - t0
    stop.set()
    th.join()
    during = [t for t in ticks if t0 < t < t0 + spun]
    # (~180 ticks of ~1.1 ms; a GIL-holding loop lets it in once per 5 ms switch interval: ~30)
    assert spun >= 0.15 and len(during) >= 80, (spun, len(during))


def test_unequal_steps_refuse_mid_run_meetings(tiny_dataset, tmp_path) -> None:
    for kw, flag in (
        ({"eval_every": 5}, "--eval-every"),
        ({"checkpoint_every": 5, "checkpoint_dir": tmp_path}, "--checkpoint-every"),
        ({"resume": True, "checkpoint_dir": tmp_path}, "--resume"),
    ):
        with pytest.raises(ConfigError, match=f"{flag} needs every rank at the same step"):
            _cfg(tiny_dataset.root, sync="async", max_lag=2, **kw)
        _cfg(tiny_dataset.root, sync="async", max_lag=0, **kw)  # (lockstep: fine)
    with pytest.raises(ConfigError, match="-1 for unbounded"):
        _cfg(tiny_dataset.root, sync="async", max_lag=-2)
