"""Thousands of random and malformed messages against the live services of a real 2-rank
``--sync async`` run (issue 31): every one answered with a refusal, counted by its reason,
no service thread dies, and training ends with the collective path's rows.

The messages come from a seeded generator (tests/rpc_fuzz.py) that breaks each one in one way
it chose, so it knows the counter each must land in; the services are the job's own (gloo
ranks, ZeroMQ on loopback with CURVE off, as on one host), reached as tests/test_rpc_guard.py
reaches them.
"""

from __future__ import annotations

import collections
import json
import threading

import numpy as np
import pytest
import torch
from rpc_fuzz import Fuzzer, Msg, Target
from test_async import train
from test_embedding import DIM, ROWS, make_plan
from test_rpc_guard import CASE, DENSE_SHARD, LOOPBACK

from hetgmp.comm.env import DistEnv
from hetgmp.comm.rpc.schema import REASONS
from hetgmp.comm.spawn import spawn_ranks

zmq = pytest.importorskip("zmq")

PER_SERVICE = 2500  # messages to each rank's service (5000 in all)
BATCH = 100  # sent before their answers are read (the service answers in order)
OVERSIZED = 3  # frames above the service's limit, each on a socket of its own (dropped)
SPLIT = (len(range(0, PER_SERVICE, BATCH)) // 2 + 1) * BATCH  # (they go after this many)


def targets() -> list[Target]:
    owner = make_plan("plan", 2, CASE["seed"]).embed_partition
    return [Target(p, 2, ROWS, DIM, np.flatnonzero(owner != p), DENSE_SHARD) for p in range(2)]


def answers(ctx: zmq.Context, endpoint: str, msgs: list[Msg]) -> list[str | None]:
    """Each message's answer (its error text; "" for a reply without one, None for none),
    ``BATCH`` in flight at a time."""
    out: list[str | None] = []
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    for i in range(0, len(msgs), BATCH):
        chunk = msgs[i : i + BATCH]
        for _, frames in chunk:
            s.send_multipart(frames)
        for j in range(len(chunk)):
            if not s.poll(5000):  # (an answer missing: the rest count as none)
                return out + [None] * (len(msgs) - i - j)
            reply = s.recv_multipart()
            out.append(json.loads(reply[1])["meta"].get("error", "") if len(reply) > 1 else "")
        if i + BATCH == SPLIT:
            out += oversized(ctx, endpoint)  # (halfway: the service must go on after them)
    return out


def oversized(ctx: zmq.Context, endpoint: str) -> list[str | None]:
    got = []
    for _ in range(OVERSIZED):
        big = ctx.socket(zmq.DEALER)
        big.setsockopt(zmq.LINGER, 0)
        big.connect(endpoint)
        big.send_multipart([b"read", b"{}", b"\0" * ((1 << 20) + 1)])
        got.append("big" if big.poll(500) else "dropped")
        big.close()
    return got


def fuzzed_training(env: DistEnv) -> dict:
    """The collective reference, then the async run under fire: what each service answered
    (from rank 0, a client of no rank), the counters, and whether the service was alive."""
    import hetgmp.embedding.rowservice.service as row_service
    from hetgmp.train.dense_server import DenseServer

    ref = train(env, CASE, "collective")
    row_service.MAX_FRAME_BYTES = 1 << 20  # (the oversized frames stay small)
    got: dict[int, list] = {}
    alive: list[bool] = []
    done = threading.Event()

    def hook(emb) -> None:  # (the table is up: its services listen)
        stepper, close = emb._stepper, emb.close
        service = stepper.service

        def closing() -> None:  # (after every answer: the barrier follows the fuzzing)
            alive.append(service.thread.is_alive() and service.failure is None)
            close()

        emb.close = closing
        torch.manual_seed(0)
        DenseServer(env, list(torch.nn.Linear(3, 4).parameters()), stepper, 1)
        if env.rank == 0:
            threading.Thread(target=attack, args=(stepper.endpoints,), daemon=True).start()

    def attack(endpoints: list[str]) -> None:
        ctx = zmq.Context()
        try:
            for t in targets():
                got[t.rank] = answers(ctx, endpoints[t.rank], messages(t))
        finally:
            ctx.destroy(linger=0)
            done.set()

    res = train(env, {**CASE, "async": LOOPBACK}, "async", hook=hook, done=done)
    return {"ref": ref["sd"], **res, "got": got, "alive": alive}


def messages(t: Target) -> list[Msg]:
    return Fuzzer(31 + t.rank, t).messages(PER_SERVICE)


def test_thousands_of_fuzzed_messages_are_each_refused_and_counted() -> None:
    out = spawn_ranks(fuzzed_training, 2, timeout_s=150)
    for r in range(2):  # (the collective path's rows: nothing the fuzzer sent reached them)
        assert out[r]["alive"] == [True]
        for k, v in out[r]["ref"].items():
            torch.testing.assert_close(out[r]["sd"][k], v, atol=1e-5, rtol=1e-5)
    for t in targets():
        msgs, got = messages(t), out[0]["got"][t.rank]
        assert got[SPLIT : SPLIT + OVERSIZED] == ["dropped"] * OVERSIZED
        got = got[:SPLIT] + got[SPLIT + OVERSIZED :]
        assert len(got) == len(msgs) == PER_SERVICE
        missing = [i for i, a in enumerate(got) if not (a or "").startswith(f"rank {t.rank}: ")]
        assert not missing, [(i, msgs[i][0], msgs[i][1][:2], got[i]) for i in missing[:5]]
        want = collections.Counter(reason for reason, _ in msgs)
        counters = out[t.rank]["counters"]
        for reason in REASONS:
            assert counters[f"rpc_refused_{reason}"] == want[reason], (t.rank, reason, counters)
        assert counters["rpc_refused"] == PER_SERVICE
        assert min(want[r] for r in ("malformed", "unknown", "invalid", "nonfinite")) >= 40
