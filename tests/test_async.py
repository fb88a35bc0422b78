"""``--sync async`` (issue 17): the ZeroMQ row service and the asynchronous step, on spawned
gloo CPU ranks, against the collective path and the protocol's invariants."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest
import torch
from test_embedding import (
    BATCH,
    DIM,
    ROWS,
    make_batches,
    make_grads,
    make_plan,
    rank_slice,
    step_loss,
    union,
)

from hetgmp.comm.env import DistEnv
from hetgmp.comm.rpc.service import (
    ANSWER_SWITCH_INTERVAL_S,
    SWITCH_INTERVAL_S,
    THREAD_PREFIX,
)
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.embedding import DistributedEmbedding
from hetgmp.embedding.init import initial_rows
from hetgmp.embedding.rowservice import AsyncConfig

pytest.importorskip("zmq")

FAST = AsyncConfig(max_lag=0, host="127.0.0.1", timeout_s=20.0)


def table(env: DistEnv, case: dict, sync: str, **kw) -> DistributedEmbedding:
    plan = make_plan("plan", env.world_size, case["seed"])
    return DistributedEmbedding(
        ROWS, DIM, env, plan, store_rate=case["store_rate"], bound=case.get("bound", 0),
        optimizer=case["optimizer"], lr=0.05, seed=case["seed"], adagrad_init=0.1,
        sync=sync, async_config=case.get("async", FAST), **kw,
    )  # fmt: skip


def train(env: DistEnv, case: dict, sync: str, hook=None, done=None) -> dict:
    """Train a case; its owned rows after flush, counters, and the per-rank delays slept.
    ``hook(table)`` runs once the table is up; ``done`` (an event) is waited for before the
    end (tests/test_rpc_guard.py: a foreign client's messages, all answered by then)."""
    emb = table(env, case, sync)
    if hook is not None:
        hook(emb)
    sl = rank_slice(env.rank, env.world_size)
    rng = np.random.default_rng(env.rank)
    for ids, g in zip(
        make_batches(case["seed"], steps=6), make_grads(case["seed"], 6), strict=True
    ):
        if case.get("delay"):
            time.sleep(float(rng.uniform(0, case["delay"])))
        out = emb(torch.from_numpy(ids[sl]))
        step_loss(out, torch.from_numpy(g[sl]), BATCH).backward()
    if done is not None:
        from hetgmp.comm.collectives import barrier

        done.wait(60) if env.rank == 0 else None
        barrier(env)
    sd = emb.state_dict()
    out = {"sd": sd, "counters": emb.counters()}
    emb.close()
    return out


def both_ways(env: DistEnv, cases: list[dict]) -> list[dict]:
    return [{s: train(env, c, s) for s in ("collective", "async")} for c in cases]


def test_bound0_maxlag0_equals_collective() -> None:
    cases = [
        {"optimizer": "sgd", "store_rate": 0.3, "seed": 1},
        {"optimizer": "sgd", "store_rate": 0.0, "seed": 2, "delay": 0.02},
        # row-wise Adagrad: owners apply a step's pushes in one update per row (drain)
        {"optimizer": "adagrad", "store_rate": 0.3, "seed": 6, "delay": 0.02},
        {"optimizer": "adagrad", "store_rate": 0.0, "seed": 7},
    ]
    results = spawn_ranks(both_ways, 2, cases, timeout_s=180)
    assert_async_equals_collective(results, len(cases), atol=1e-6)


def assert_async_equals_collective(results: list, n_cases: int, atol: float) -> None:
    """:func:`both_ways` results: per case the same rows (ids, values to ``atol``) and the same
    reads row by row."""
    for i in range(n_cases):
        coll = union([r[i]["collective"]["sd"] for r in results])
        asyn = union([r[i]["async"]["sd"] for r in results])
        assert torch.equal(coll["ids"], asyn["ids"])
        torch.testing.assert_close(asyn["weight"], coll["weight"], rtol=1e-5, atol=atol)
        for r in results:  # the same reads, row by row
            for k in ("rows_owned", "rows_mirror_fresh", "rows_remote", "rows_requested"):
                assert r[i]["async"]["counters"][k] == r[i]["collective"]["counters"][k], k


# ------------------------------------------- one message per owner: pushes and clocks alone
def own_only_both_ways(env: DistEnv) -> dict:
    """:func:`own_only_steps` for both store rates and both step kinds, in one spawn."""
    return {(r, s): own_only_steps(env, r, s) for r in (0.0, 0.3) for s in ("collective", "async")}


def own_only_steps(env: DistEnv, store_rate: float, sync: str) -> dict:
    """SGD on fixed output gradients (the final rows are the initial rows minus lr x every
    gradient, whatever the order and staleness): rank 0's second and third batches hold only
    rows it owns, so under --max-lag 2 its step 1 sends the peer a push with the clock and no
    read, and its step 2 the clock alone; the other steps read from the peer."""
    plan = make_plan("plan", env.world_size, 11)
    cfg = AsyncConfig(max_lag=2, host="127.0.0.1", timeout_s=20.0)
    emb = DistributedEmbedding(
        ROWS, DIM, env, plan, store_rate=store_rate, bound=0, optimizer="sgd", lr=0.1, seed=11,
        sync=sync, async_config=cfg if sync == "async" else None,
    )  # fmt: skip
    rng = np.random.default_rng(env.rank)
    own = np.flatnonzero(plan.embed_partition == env.rank)
    sent = []
    for t in range(5):
        pool = own if env.rank == 0 and t in (1, 2) else np.arange(ROWS)
        ids = torch.from_numpy(rng.choice(pool, (BATCH, 3)))
        g = torch.from_numpy(rng.standard_normal((BATCH, 3, DIM)).astype(np.float32))
        (emb(ids) * g).sum().backward()
        if sync == "async":
            sent.append(dict(emb._stepper.service.received))
    emb.flush()
    out = {"sd": emb.state_dict(), "received": sent}
    emb.close()
    return out


def test_pushes_and_clocks_alone_reach_the_owner() -> None:
    ranks = spawn_ranks(own_only_both_ways, 2, timeout_s=120)
    for store_rate in (0.0, 0.3):
        res = {s: [r[store_rate, s] for r in ranks] for s in ("collective", "async")}
        coll = union([r["sd"] for r in res["collective"]])
        asyn = union([r["sd"] for r in res["async"]])
        assert torch.equal(coll["ids"], asyn["ids"])
        torch.testing.assert_close(asyn["weight"], coll["weight"], rtol=1e-5, atol=1e-6)
        got = res["async"][1]["received"][-1]  # (what rank 1's service had received by then)
        assert got["push"] >= 1 and got["clock"] >= 1, got  # (the lone push and clock)


# ---------------------------------------------------------------- bound > 0, audited, delays
def audited_async(env: DistEnv, bound: int, max_lag: int, seed: int, ahead: bool = False) -> dict:
    """SGD, lr 1, loss = sum of column 0: a value's column 0 counts the updates in it, so the
    lag of every read can be measured from the values themselves (as test_embedding does)."""
    world = env.world_size
    cfg = AsyncConfig(max_lag=max_lag, host="127.0.0.1", timeout_s=30.0)
    emb = DistributedEmbedding(
        ROWS, DIM, env, make_plan("plan", world, seed), store_rate=0.5, bound=bound,
        optimizer="sgd", lr=1.0, seed=seed, init_scale=0.01, audit=True, sync="async",
        async_config=cfg,
    )  # fmt: skip
    return audit_steps(emb, env, bound, seed, ahead)


def measured_lag(a: dict, init0: torch.Tensor) -> torch.Tensor:
    """The lag of every mirror read of a step's audit ``a`` that was not refreshed, measured
    from the values (column 0 of a row counts its updates; ``init0``: the rows' initial column
    0), checked against the owner's version and the recorded lag."""
    m = a["is_mirror"] & ~a["refreshed"]
    owner_updates = torch.round(init0[a["ids"]] - a["owner_value"][:, 0]).long()
    assert torch.equal(owner_updates, a["owner_version"]), "owner version = its updates"
    used = torch.round(init0[a["ids"]] - a["used_value"][:, 0]).long() - a["pending"]
    lag = (owner_updates - used)[m]
    assert torch.equal(lag, a["lag"][m]), "recorded lag = lag measured from values"
    return lag


def audit_steps(
    emb: DistributedEmbedding, env: DistEnv, bound: int, seed: int, ahead: bool = False
) -> dict:
    """10 audited steps at uneven per-rank speeds on ``emb`` (CPU or CUDA): the worst measured
    lag, the stale reads, the rows requested and the counters; flushes and closes ``emb``.
    ``ahead``: each step's push and the next batch's reads go out right after backward."""
    world, dev = env.world_size, env.device
    init0 = initial_rows(torch.arange(ROWS), DIM, seed=seed, scale=0.01)[:, 0]
    rng = np.random.default_rng(100 + env.rank)
    worst, stale, requested = 0, 0, 0
    sl = rank_slice(env.rank, world, 8 * world)
    batches = [torch.from_numpy(b[sl]).to(dev) for b in make_batches(seed + bound, 10, 8 * world)]
    for t, ids in enumerate(batches):
        time.sleep(float(rng.uniform(0, 0.03)) * (1 + env.rank))  # uneven per-rank speeds
        mine = ids.cpu().numpy()
        emb(ids)[..., 0].sum().backward()
        if ahead and t + 1 < len(batches):
            emb.send_ahead(batches[t + 1])
        a = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in emb.last_audit.items()}
        lag = measured_lag(a, init0)
        if lag.numel():
            worst, stale = max(worst, int(lag.max())), stale + int((lag > 0).sum())
        assert emb.step_counters()["rows_requested"] == np.unique(mine).size
        requested += np.unique(mine).size
    emb.flush()
    out = {"worst": worst, "stale": stale, "requested": requested, "counters": emb.counters()}
    emb.close()
    return out


@pytest.mark.parametrize("bound,max_lag,ahead", [(0, 2, False), (3, 2, False), (3, 2, True)])
def test_every_read_within_bound_under_random_delays(bound: int, max_lag: int, ahead: bool) -> None:
    results = spawn_ranks(audited_async, 3, bound, max_lag, 5, ahead, timeout_s=180)
    assert max(r["worst"] for r in results) <= bound
    if bound == 0:
        assert sum(r["stale"] for r in results) == 0
    # counters add up: every byte sent is received somewhere, every read is classified
    c = [r["counters"] for r in results]
    for kind in ("ids", "versions", "values", "gradients"):
        assert sum(x[f"bytes_sent_{kind}"] for x in c) == sum(x[f"bytes_recv_{kind}"] for x in c)
    for r, x in zip(results, c, strict=True):
        assert x["rows_requested"] == r["requested"]
        assert x["rows_remote"] >= x["rows_mirror_refreshed"]
    assert sum(x["pushes_sent"] for x in c) > 0


# ---------------------------------------------------------------- failures and shutdown
def dies_at_step_two(env: DistEnv, how: str) -> str:
    emb = table(env, {"optimizer": "sgd", "store_rate": 0.3, "seed": 3,
                      "async": AsyncConfig(max_lag=1, host="127.0.0.1", timeout_s=4.0)}, "async")  # fmt: skip
    sl = rank_slice(env.rank, env.world_size)
    for t, ids in enumerate(make_batches(3, steps=6)):
        if env.rank == 1 and t == 2:
            if how == "exit":
                import os

                os._exit(3)  # no goodbye: the peers must notice by their timeout
            raise RuntimeError("rank 1 simulated crash")
        emb(torch.from_numpy(ids[sl])).sum().backward()
    return "finished"


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_dead_peer_gives_a_clear_error(how: str) -> None:
    t0 = time.monotonic()
    outcomes = spawn_ranks(
        dies_at_step_two, 2, how, timeout_s=90, collective_timeout_s=20, raise_on_error=False
    )
    assert outcomes[1].status == ("error" if how == "raise" else "died")
    o = outcomes[0]
    assert o.status == "error" and o.error_type == "CommError", o
    assert "rank 1" in o.message, o.message
    if how == "raise":  # it said goodbye: no need to wait for the timeout
        assert "closed its table" in o.message, o.message
    else:
        assert "within 4s" in o.message or "waited 4s" in o.message, o.message
    assert time.monotonic() - t0 < 60


def clean_shutdown(env: DistEnv) -> dict:
    from hetgmp.comm.launch import shutdown

    sys.setswitchinterval(0.004)  # (the process's own setting: the service must restore it)
    emb = table(env, {"optimizer": "adagrad", "store_rate": 0.3, "seed": 4}, "async")
    sl = rank_slice(env.rank, env.world_size)
    for ids in make_batches(4, steps=3):
        emb(torch.from_numpy(ids[sl])).sum().backward()
    emb.flush()
    stepper = emb._stepper
    alive_before = [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]
    # (the peer's last meeting message may still be in this service's answer, which shortens
    # the interval for a moment: look again until it is back, or give up after a second)
    for _ in range(100):
        switch_serving = sys.getswitchinterval()
        if switch_serving == pytest.approx(SWITCH_INTERVAL_S):
            break
        time.sleep(0.01)
    shutdown(env, wait_for_peers=True)  # runs the table's closer
    return {
        "switch": (switch_serving, sys.getswitchinterval()),
        "before": alive_before,
        "after": [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)],
        "ctx_closed": stepper.service.zctx.closed,
        "socks_closed": stepper.service.sock.closed
        and all(s.closed for s in stepper.peers.socks.values()),
    }


def test_shutdown_leaves_no_thread_or_socket() -> None:
    for r in spawn_ranks(clean_shutdown, 2, timeout_s=120):
        assert len(r["before"]) == 1
        assert r["after"] == [] and r["ctx_closed"] and r["socks_closed"]
        assert r["switch"] == pytest.approx((SWITCH_INTERVAL_S, 0.004))


def switch_while_answering(env: DistEnv) -> dict:
    from hetgmp.comm.collectives import barrier
    from hetgmp.train import dense_server as wire  # (DENSE: any registered op does)

    emb = table(env, {"optimizer": "sgd", "store_rate": 0.0, "seed": 1}, "async")
    stepper = emb._stepper
    seen = lambda meta, arrays: {"s": torch.tensor([sys.getswitchinterval()])}  # noqa: E731
    from hetgmp.comm.rpc.schema import Array, Schema

    stepper.service.register(wire.DENSE, seen, Schema())  # (answered by its handler)
    barrier(env)
    peer = 1 - env.rank
    expect = lambda p: Schema({}, {"s": Array("float32")})  # noqa: E731
    answer = stepper.peers.request_all({peer: (wire.DENSE, {}, {})}, "test", expect)[peer]
    barrier(env)  # (both answered: a service restores the interval before it sends)
    out = {"answering": float(answer["s"][0]), "serving": sys.getswitchinterval()}
    # (read before either rank closes: a peer's goodbye is answered with the short interval
    # too, and one that arrived while this rank read it failed CI once)
    barrier(env)
    emb.close()
    return out


def test_service_answers_with_the_short_switch_interval() -> None:
    """While it answers, the service shortens the GIL switch interval (a busy training thread
    would hold each answer for many intervals); between answers the serving interval holds."""
    for r in spawn_ranks(switch_while_answering, 2, timeout_s=120):
        assert r["answering"] == pytest.approx(ANSWER_SWITCH_INTERVAL_S, rel=0.2)
        assert r["serving"] == pytest.approx(SWITCH_INTERVAL_S, rel=0.01)


def refused_reads(env: DistEnv) -> dict:
    from hetgmp.comm.collectives import barrier
    from hetgmp.comm.errors import CommError
    from hetgmp.embedding.rowservice import wire

    emb = table(env, {"optimizer": "sgd", "store_rate": 0.0, "seed": 1}, "async")
    stepper, peer = emb._stepper, 1 - env.rank
    slot_of, n_own = stepper.ctx.store.slot_of, stepper.ctx.store.n_own
    mine = int(torch.nonzero((slot_of >= 0) & (slot_of < n_own))[0])
    theirs = int(torch.nonzero(slot_of < 0)[0])  # (2 ranks, no mirrors: the peer's)
    out = {}
    empty = torch.zeros(0, dtype=torch.int64)
    for name, rid in (("outside", ROWS + 5), ("negative", -3), ("theirs", theirs), ("mine", mine)):
        req = {"mids": empty, "mver": empty, "rids": torch.tensor([rid])}
        meta = {"bound": 0, "send_all": False}
        try:
            expect = lambda p: wire.read_reply(0, 1, DIM, False, 0, False)  # noqa: E731
            got = stepper.peers.request_all({peer: (wire.READ, meta, req)}, "test read", expect)
            got = got[peer]
            out[name] = ("ok", tuple(got["values"].shape))
        except CommError as err:
            out[name] = ("refused", str(err))
    ids = torch.tensor([theirs, theirs])
    for name, op, req in (
        ("short mver", wire.READ, {"mids": ids, "mver": ids[:1], "rids": empty}),
        ("short grad", wire.PUSH, {"ids": ids, "cnt": ids, "grad": torch.zeros(2 * DIM - 1)}),
    ):  # fmt: skip
        meta = {"bound": 0, "send_all": False} if op == wire.READ else {}
        try:
            stepper.peers.request_all({peer: (op, meta, req)}, "test request")
            out[name] = ("ok", "")
        except CommError as err:
            out[name] = ("refused", str(err))
    barrier(env)
    emb.close()
    return out


def test_service_refuses_reads_of_rows_it_does_not_own() -> None:
    """A read naming an id outside the table, or a row the service's rank does not own, gets
    a refusal that says which; a row it owns is answered. So do reads and pushes whose arrays
    do not match (versions per mirror id, gradient values per row)."""
    for r in spawn_ranks(refused_reads, 2, timeout_s=120):
        assert r["outside"][0] == "refused" and "outside the table" in r["outside"][1]
        assert r["negative"][0] == "refused" and "outside the table" in r["negative"][1]
        assert r["theirs"] == ("ok", (1, DIM))
        assert r["mine"][0] == "refused" and "does not own" in r["mine"][1]
        # (malformed requests: a refusal naming the mismatch, and the service keeps serving)
        assert r["short mver"][0] == "refused" and "1 versions for 2" in r["short mver"][1]
        assert r["short grad"][0] == "refused" and "gradient values" in r["short grad"][1]


def test_async_refuses_what_it_does_not_support() -> None:
    env = DistEnv(world_size=2, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="exchange='padded'"):
        DistributedEmbedding(ROWS, DIM, env, sync="async", exchange="padded", replies="all")
    with pytest.raises(ValueError, match="sync must be one of"):
        DistributedEmbedding(ROWS, DIM, env, sync="bulk")
    with pytest.raises(ValueError, match="max_lag"):
        AsyncConfig(max_lag=-2)
