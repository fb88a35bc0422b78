"""``--sync async``'s device plumbing: the host staging buffers (:mod:`hetgmp.comm.rpc.stage`)
and the table lock (:mod:`hetgmp.embedding.rowservice.lock`), on the CPU (the reuse logic, forced on) and on CUDA (pinned
buffers, non-blocking copies, the lock ordering two threads' streams)."""

from __future__ import annotations

import threading

import pytest
import torch

from hetgmp.comm.rpc.stage import ALIGN, HostStage
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.embedding.rowservice import wire
from hetgmp.embedding.rowservice.lock import TableLock

needs_cuda = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def message(seed: int, n: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "ids": torch.randint(0, 1000, (n,), generator=g).to(device),
        "grad": torch.randn(n, 3, generator=g).to(device),
        "cnt": torch.randint(1, 5, (n,), generator=g).to(device),
        "empty": torch.zeros(0, 3, device=device),
    }


def round_trip(stage: HostStage, msgs: list[dict[str, torch.Tensor]]) -> list[dict]:
    """Through the stage and the wire format, as a peer and a service move them."""
    frames = [wire.pack(wire.PUSH, {}, h) for h in stage.to_host(msgs)]
    frames = [[bytes(f) for f in fr] for fr in frames]  # (what the socket delivers)
    stage.begin_receive()
    return [wire.unpack(fr, stage)[2] for fr in frames]


def assert_same(got: list[dict], want: list[dict]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k in w:
            assert g[k].device == w[k].device, k
            assert g[k].dtype == w[k].dtype and torch.equal(g[k], w[k]), k


@pytest.mark.parametrize("reuse", [False, True])
def test_stage_round_trip_on_cpu(reuse: bool) -> None:
    stage = HostStage(torch.device("cpu"), reuse=reuse)
    for seed, n in [(0, 5), (1, 40), (2, 3), (3, 0)]:
        msgs = [message(seed, n), message(seed + 10, n + 1)]
        assert_same(round_trip(stage, msgs), msgs)


def test_reused_buffers_grow_only_and_stay_aligned() -> None:
    stage = HostStage(torch.device("cpu"), reuse=True)
    round_trip(stage, [message(0, 100)])
    grown, out_ptr, in_ptr = stage.grown, stage._out.data_ptr(), stage._in.data_ptr()
    got = round_trip(stage, [message(1, 60), message(2, 30)])  # smaller: no new buffer
    assert stage.grown == grown
    assert (stage._out.data_ptr(), stage._in.data_ptr()) == (out_ptr, in_ptr)
    for m in got:
        for t in (t for t in m.values() if t.numel()):
            assert (t.data_ptr() - in_ptr) % ALIGN == 0
            assert in_ptr <= t.data_ptr() < in_ptr + stage._in.numel()  # (in the buffer)
    round_trip(stage, [message(3, 1000)])  # larger: grows once per buffer
    assert stage.grown == grown + 2


def test_malformed_messages_are_refused() -> None:
    stage = HostStage(torch.device("cpu"))
    frames = [bytes(f) for f in wire.pack(wire.PUSH, {}, message(0, 4))]
    with pytest.raises(ValueError, match="bytes for int64"):
        wire.unpack([*frames[:2], frames[2][:-8], *frames[3:]], stage)
    with pytest.raises(ValueError, match="naming 4 arrays for 3 frames"):
        wire.unpack(frames[:-1], stage)
    with pytest.raises(ValueError, match="host tensors"):
        wire.pack(wire.PUSH, {}, {"x": torch.zeros(2, dtype=torch.int32)})


def test_table_lock_is_reentrant_and_exclusive() -> None:
    lock, seen = TableLock(torch.device("cpu")), []

    def other() -> None:
        with lock:
            seen.append("other")

    with lock:
        with lock:  # (the training thread nests it)
            t = threading.Thread(target=other)
            t.start()
            t.join(0.2)
            assert t.is_alive() and not seen  # the other thread waits for the outer release
        seen.append("inner released")
        t.join(0.1)
        assert seen == ["inner released"]
    t.join(5)
    assert seen == ["inner released", "other"]
    lock.fence()  # (CPU: nothing to order)


def train_reusing(env, case: dict, sync: str) -> dict:
    from test_async import train

    from hetgmp.comm.rpc import stage as async_stage

    async_stage.REUSE_ON_CPU = True  # (this spawned rank only)
    return train(env, case, sync)


def both_ways_reusing(env, cases: list[dict]) -> list[dict]:
    return [{s: train_reusing(env, c, s) for s in ("collective", "async")} for c in cases]


def test_async_through_reused_buffers_equals_collective() -> None:
    """Real CPU ranks with the buffer logic CUDA uses (grow-only reused buffers, several
    replies per batch, views handed out) train as ``--sync collective`` at bound 0."""
    pytest.importorskip("zmq")
    from test_embedding import union

    cases = [{"optimizer": "sgd", "store_rate": 0.3, "seed": 1}]
    results = spawn_ranks(both_ways_reusing, 3, cases, timeout_s=180)
    coll = union([r[0]["collective"]["sd"] for r in results])
    asyn = union([r[0]["async"]["sd"] for r in results])
    assert torch.equal(coll["ids"], asyn["ids"])
    torch.testing.assert_close(asyn["weight"], coll["weight"], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_stage_pinned_round_trip() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    stage = HostStage(dev)
    assert stage.reuse
    for seed, n in [(0, 50), (1, 7), (2, 300), (3, 0)]:
        msgs = [message(seed, n, "cuda"), message(seed + 10, n + 2, "cuda")]
        got = round_trip(stage, msgs)
        assert_same(got, msgs)
        assert stage._in.is_pinned() and stage._out.is_pinned()
    grown = stage.grown
    round_trip(stage, [message(5, 100, "cuda")])
    assert stage.grown == grown  # (reused, not reallocated)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_stage_waits_before_overwriting_a_buffer_in_flight() -> None:
    """A message received right after another (the first one's copy to the device still
    queued behind a long kernel) must not overwrite the pinned bytes the first copy reads."""
    dev = torch.device("cuda", torch.cuda.current_device())
    stage = HostStage(dev)
    first, second = message(0, 4096, "cuda"), message(1, 4096, "cuda")
    f1 = [bytes(f) for f in wire.pack(wire.PUSH, {}, {k: v.cpu() for k, v in first.items()})]
    f2 = [bytes(f) for f in wire.pack(wire.PUSH, {}, {k: v.cpu() for k, v in second.items()})]
    for _ in range(3):
        stage.begin_receive()
        torch.cuda._sleep(50_000_000)  # (the stream is busy: the copy below waits)
        got1 = wire.unpack(f1, stage)[2]
        stage.begin_receive()  # waits for got1's copy before the buffer is written again
        got2 = wire.unpack(f2, stage)[2]
        assert_same([got1, got2], [first, second])


def _slow_writer(lock: TableLock, x: torch.Tensor, value: float, done: threading.Event) -> None:
    """Another thread on its own stream (as the service is) writes ``x`` under the lock."""
    stream = torch.cuda.Stream(device=x.device)
    with torch.cuda.device(x.device), torch.cuda.stream(stream):
        with lock:
            torch.cuda._sleep(100_000_000)  # (~50 ms of GPU time before the write)
            x.fill_(value)
    done.set()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_table_lock_orders_two_threads_streams() -> None:
    """The training thread's stream sees what the service thread's stream enqueued under the
    lock before it (and the other way round) without any device-wide synchronization."""
    dev = torch.device("cuda", torch.cuda.current_device())
    lock = TableLock(dev)
    x = torch.zeros(1 << 20, device=dev)
    for value in (1.0, 2.0, 3.0):
        done = threading.Event()
        t = threading.Thread(target=_slow_writer, args=(lock, x, value, done))
        t.start()
        assert done.wait(30)
        t.join()
        with lock:  # the writer's kernel may still be queued: this stream must wait for it
            seen = x.clone()
        assert bool((seen == value).all()), f"read before the other stream's write ({value})"
        with lock:  # and the other way round: our write is ordered before the next writer's
            torch.cuda._sleep(100_000_000)
            x.fill_(-1.0)
    torch.cuda.synchronize()
    assert bool((x == -1.0).all())
