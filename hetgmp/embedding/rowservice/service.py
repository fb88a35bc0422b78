"""The per-rank row service of ``--sync async``: a thread with a ZeroMQ ROUTER socket that
answers reads of the rows this rank owns and applies the gradients peers push to them, and the
rank's table of its peers' clocks (stale synchronous parallel, see :mod:`.step`).

Three requests (:mod:`.wire`):

* **read** ``(mids, mver, rids)`` + the requester's ``bound`` and ``send_all``: the lag of every
  mirror query (``owner version - mirror version``, :func:`protocol.lags`) and value, version
  (and optimizer state) of the mirrors beyond the bound (every mirror with ``send_all``, as in
  audit mode) and of every row not stored there, all read under the table lock at one moment;
* **push** ``(ids, cnt, grad)``: buffered (under the lock) and acknowledged; the buffer, with
  the owner's own rows' gradient of its step (:meth:`AsyncService.stash_own`), is applied with
  the owner's sparse optimizer in one :func:`protocol.apply_at_owner` call right before the
  next read of this rank's rows (:meth:`AsyncService.drain`: a peer's read, or the owner's own
  read phase), so a worker that has its acks knows its update is visible to every later read,
  and a row gets one optimizer step for all the pushes of a step (row-wise Adagrad then
  equals the collective path at ``--bound 0 --max-lag 0``);
* **clock** ``(rank, clock, samples)``: a peer's progress (no answer): its clock and the
  training samples it has taken so far (the budget stop rule of :mod:`hetgmp.train.async_loop`);
  under ``--max-lag`` != 0 a training step's clock rides on its read, with the push to this
  owner in the same message (:meth:`AsyncService._step`: push, then clock, then the answer);
* other ops registered in :attr:`AsyncService.handlers` (the dense parameter shards of
  :mod:`hetgmp.train.dense_server`), answered by their handler.

The lock (:class:`~.stage.TableLock`) is shared with the training thread, which takes it
for its own use of the table (owned rows, mirror staging, reads). On CUDA the table stays on the
device: the thread runs on a CUDA stream of its own (the lock orders it with the training
thread's). Requests are read on the host, where their ids are checked and looked up (no wait
for the device); what the table needs goes to the device through pinned memory, and a read is
gathered there and copied back for the reply (into pageable memory, one blocking copy per
array: the answer's one wait for the device; one pinned copy is a next step). The arithmetic
is scripted (:mod:`.answer`): an answer runs without the GIL.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from hetgmp.comm.errors import CommError
from hetgmp.embedding.rowservice import answer
from hetgmp.embedding.rowservice import wire as wire
from hetgmp.embedding.rowservice.stage import HostStage, TableLock
from hetgmp.embedding.transport.base import StepContext

POLL_MS = 50  # how often the service thread looks at its stop flag
# The interpreter's GIL switch interval while a service runs, and while it answers a request.
# The service shares the interpreter with the training thread: answering takes the GIL back
# after each of its ZeroMQ and torch calls, and a training thread that runs Python (on CUDA:
# launching kernels) keeps it until the interval forces a switch. Measured when an answer made
# about a hundred such calls (bench/results/async_gil.md, 2 CPU ranks, the peer's training
# thread in a pure-Python loop, 64 x 26 ids): a read took 454 ms with CPython's default 5 ms,
# 9-14 ms with 100 us, 8.3-9.3 ms with 5 us while answering, 1.2 ms with the peer idle. The
# arithmetic is scripted now (async_answer: no GIL), which leaves about a dozen (socket frames,
# header, one scripted call); the short interval still bounds what each of them waits. Outside
# an answer the interval stays at 100 us, so the training thread and its data loader thread do
# not switch every 5 us.
SWITCH_INTERVAL_S = 1e-4
ANSWER_SWITCH_INTERVAL_S = 5e-6
THREAD_PREFIX = "hetgmp-async-service"


class AsyncService:
    """The service of one rank: bound on ``host:port`` (0: a port the OS picks) at
    construction, serving from :meth:`start` until :meth:`close`."""

    def __init__(self, ctx: StepContext, lock: TableLock, host: str, port: int) -> None:
        self.zmq = zmq = wire.import_zmq()
        self.ctx, self.lock = ctx, lock
        dev = ctx.store.device
        self.stream = torch.cuda.Stream(device=dev) if dev.type == "cuda" else None
        # (messages are read on the host: the scripted answers check ids there and move what
        # the table needs to its device through pinned memory, async_answer)
        self.stage = HostStage(torch.device("cpu"), reuse=False)
        self.own_slot = _own_slots(ctx.store)
        self.zctx = zmq.Context()
        self.sock = self.zctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        try:
            if port:
                self.sock.bind(f"tcp://{host}:{port}")
            else:
                port = self.sock.bind_to_random_port(f"tcp://{host}")
        except zmq.ZMQError as err:
            self.sock.close()
            self.zctx.term()
            raise CommError(
                f"rank {ctx.env.rank}: the async row service cannot listen on {host}:{port} "
                f"({err}); pick another --async-host / --async-port-base"
            ) from err
        self.endpoint = f"tcp://{host}:{port}"
        w = ctx.env.world_size
        self.clocks = [0] * w
        self.samples = [0] * w  # training samples each rank has taken (clock messages)
        self.meets = [0] * w  # the meetings each rank has arrived at (AsyncStep.meet)
        # extra request kinds: op -> handler(meta, arrays) -> reply arrays (service thread)
        self.handlers: dict[bytes, Callable[[dict[str, Any], dict[str, torch.Tensor]], Any]] = {}
        self.clock_cv = threading.Condition()
        self.gone: set[int] = set()  # ranks that closed their table (failed or finished)
        self.bytes = {f"bytes_{d}_{k}": 0 for d in ("sent", "recv") for k in _KINDS}
        # messages received by kind (read, push, clock, dense, claim): each one takes the GIL
        # from the training thread, so fewer a step is faster (see AsyncStep._begin)
        self.received: dict[str, int] = {op.decode(): 0 for op in (*wire.OPS, b"other")}
        self.failure: BaseException | None = None
        # pushes accepted but not yet applied, and the owner's own rows' gradient (drain())
        self.buffered: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.own: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._stop = threading.Event()
        self._switch = 0.0  # the interpreter's switch interval before start(), if it set one
        self._ours = -1.0  # the one start() set
        self.thread = threading.Thread(
            target=self._run, name=f"{THREAD_PREFIX}-{ctx.env.rank}", daemon=True
        )

    def start(self) -> None:
        before = sys.getswitchinterval()
        if SWITCH_INTERVAL_S and before > SWITCH_INTERVAL_S:  # (else: not ours to change)
            sys.setswitchinterval(SWITCH_INTERVAL_S)  # (restored by close(): see above)
            self._switch, self._ours = before, sys.getswitchinterval()  # (as stored)
        self.thread.start()

    def close(self) -> None:
        """Stop the thread, close the socket and terminate the context (idempotent)."""
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join()
        if self._switch and sys.getswitchinterval() == self._ours:
            sys.setswitchinterval(self._switch)  # (unless someone changed it since)
        self._switch = 0.0
        if not self.sock.closed:
            self.sock.close(linger=0)
        if not self.zctx.closed:
            self.zctx.term()

    # ------------------------------------------------------------------ clocks
    def set_clock(
        self, rank: int, clock: int, gone: bool = False, samples: int = 0, meet: int = 0
    ) -> None:
        with self.clock_cv:
            self.clocks[rank] = max(self.clocks[rank], clock)
            self.samples[rank] = max(self.samples[rank], samples)
            self.meets[rank] = max(self.meets[rank], meet)
            if gone:
                self.gone.add(rank)
            self.clock_cv.notify_all()

    def check_peer(self, peer: int, what: str) -> None:
        """Raise if ``peer`` has closed its table or this service has failed."""
        if self.failure is not None:
            raise CommError(f"rank {self.ctx.env.rank}: the async row service failed") from (
                self.failure
            )
        if peer in self.gone:
            raise CommError(
                f"rank {self.ctx.env.rank}: {what}: rank {peer} closed its table (it failed or "
                "left early) while this rank still needed it"
            )

    def wait_clock(
        self, target: int, timeout_s: float, what: str, budget: int | None = None
    ) -> bool:
        """Block until every rank's clock is at least ``target``; a clear error after
        ``timeout_s`` naming the slowest rank. With ``budget``: stop waiting as soon as the
        ranks' samples add up to it, and return False then (True: the clocks are there)."""
        with self.clock_cv:

            def behind() -> list[int]:
                return [r for r, c in enumerate(self.clocks) if c < target]

            def spent() -> bool:
                return budget is not None and sum(self.samples) >= budget

            ok = self.clock_cv.wait_for(
                lambda: (
                    not behind()
                    or spent()
                    or self.failure is not None
                    or bool(self.gone & set(behind()))
                ),
                timeout_s,
            )
            if spent():
                return False
            for r in behind():
                self.check_peer(r, what)
            if not ok:
                slow = min(range(len(self.clocks)), key=self.clocks.__getitem__)
                raise CommError(
                    f"rank {self.ctx.env.rank}: {what}: waited {timeout_s:.0f}s for rank {slow} "
                    f"(clock {self.clocks[slow]}, needed {target}) under --max-lag; it probably "
                    "died or hangs"
                )
            return True

    def wait_meet(self, meet: int, timeout_s: float, what: str) -> None:
        """Block until every rank has arrived at meeting ``meet``; a clear error after
        ``timeout_s`` naming a rank that has not (or at once if one closed its table)."""
        with self.clock_cv:

            def absent() -> list[int]:
                return [r for r, m in enumerate(self.meets) if m < meet]

            ok = self.clock_cv.wait_for(
                lambda: not absent() or self.failure is not None or bool(self.gone & set(absent())),
                timeout_s,
            )
            for r in absent():
                self.check_peer(r, what)
            if not ok:
                raise CommError(
                    f"rank {self.ctx.env.rank}: {what}: waited {timeout_s:.0f}s for rank "
                    f"{absent()[0]} to arrive; it probably died or hangs"
                )

    # ------------------------------------------------------------------ buffered updates
    def stash_own(self, own: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        """The owner's own rows' ``(slots, counts, grads)`` of its step, applied at the next
        :meth:`drain` together with the pushes (one optimizer step per row)."""
        with self.lock:
            if self.own is not None:
                self.drain()
            self.own = own

    def drain(self) -> None:
        """Apply the buffered pushes and own gradient in one update (before any read)."""
        with self.lock:
            if self.own is None and not self.buffered:
                return
            own, pushed, self.own, self.buffered = self.own, self.buffered, None, []
            if self.stream is not None:  # (made on one thread's stream, used on this one's)
                stream = torch.cuda.current_stream(self.ctx.store.device)
                for t in (*(own or ()), *(x for q in pushed for x in q)):
                    t.record_stream(stream)
            store, opt = self.ctx.store, self.ctx.opt
            if own is None:
                z = store.zeros_w[:0]
                own = (z, z, store.weight[:0])
            elif own[2].dtype != store.weight.dtype:  # (an autocast gradient)
                own = (own[0], own[1], own[2].to(store.weight.dtype))
            slots, cnts, grads = ([q[i] for q in pushed] for i in range(3))
            answer.apply_updates(
                store.weight, store.version, store.opt_state, store.scratch_map(), *own,
                slots, cnts, grads, opt.name == "sgd", float(opt.lr), float(opt.eps),
            )  # fmt: skip

    # ------------------------------------------------------------------ the thread
    def _on_device(self) -> contextlib.AbstractContextManager[Any]:
        """The thread's CUDA device and stream (both are per thread), or nothing on the CPU."""
        if self.stream is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.device(self.ctx.store.device))
        stack.enter_context(torch.cuda.stream(self.stream))
        return stack

    def _run(self) -> None:
        poller = self.zmq.Poller()
        poller.register(self.sock, self.zmq.POLLIN)
        try:
            with self._on_device():
                self._serve(poller)
        except BaseException as err:  # noqa: BLE001 - handed to the training thread
            self.failure = err
            with self.clock_cv:
                self.clock_cv.notify_all()

    def _serve(self, poller: Any) -> None:
        while not self._stop.is_set():
            if not poller.poll(POLL_MS):
                continue
            frames = self.sock.recv_multipart()
            reply = self._answer(frames[1:])
            if reply is not None:
                self.sock.send_multipart([frames[0], *reply])

    def _answer(self, frames: list[bytes]) -> list[bytes] | None:
        """:meth:`_handle` with the short switch interval (see ``ANSWER_SWITCH_INTERVAL_S``)."""
        if not self._switch:  # (the interval is not this service's to change)
            return self._handle(frames)
        sys.setswitchinterval(ANSWER_SWITCH_INTERVAL_S)
        try:
            return self._handle(frames)
        finally:
            sys.setswitchinterval(SWITCH_INTERVAL_S)

    def _handle(self, frames: list[bytes]) -> list[bytes] | None:
        try:
            op, meta, arrays = wire.unpack(frames, self.stage)
            kind = op.decode() if op in wire.OPS else "other"  # (fixed keys: read elsewhere)
            self.received[kind] += 1
            if op == wire.CLOCK:
                self.set_clock(
                    int(meta["rank"]), int(meta["clock"]), bool(meta.get("gone")),
                    int(meta.get("samples", 0)), int(meta.get("meet", 0)),
                )  # fmt: skip
                return None
            if op in self.handlers:  # (counted by their owner, not as embedding bytes)
                return wire.pack(wire.REPLY, {}, self.handlers[op](meta, arrays))
            if op not in (wire.READ, wire.PUSH):
                raise ValueError(f"unknown request {op[:16]!r}")
            self._count("recv", arrays)
            if "clock" in meta:  # (a read with the sender's push and clock, or a push alone)
                self._step(meta, arrays)
            elif op == wire.PUSH:
                self._push(arrays)
            out = self._read(meta, arrays) if op == wire.READ else {}
        except (ValueError, KeyError, IndexError, RuntimeError) as err:
            return wire.pack(wire.REPLY, {"error": f"rank {self.ctx.env.rank}: {err}"}, {})
        self._count("sent", out)
        return wire.pack(wire.REPLY, {}, out)  # (host arrays: read_answer copies them)

    def _read(self, meta: dict[str, Any], a: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Drain, then one scripted call (no GIL: :mod:`.answer`) that checks the ids,
        computes the lags and gathers the answer on the host."""
        store = self.ctx.store
        if a["mver"].shape != a["mids"].shape:
            raise ValueError(f"a read carries {a['mver'].numel()} versions for "
                             f"{a['mids'].numel()} mirror ids")  # fmt: skip
        with self.lock:
            self.drain()
            code, out = answer.read_answer(
                self.own_slot, store.num_rows, store.weight, store.version, store.opt_state,
                self.ctx.opt.state_width > 0, a["mids"], a["mver"], a["rids"],
                int(meta["bound"]), bool(meta["send_all"]),
            )  # fmt: skip
        if code:
            raise ValueError(answer.MESSAGES[code])
        return dict(zip(("lag", "values", "versions", "state"), out, strict=False))

    def _step(self, meta: dict[str, Any], a: dict[str, torch.Tensor]) -> None:
        """The push a message carries (if any), then the sender's clock (one message per owner
        and step, :meth:`.step.AsyncStep._begin`): buffered before the clock moves, as
        when they came one after the other; a read it carries is answered after both. The
        clock moves even if the push is refused (its error goes back to the sender), as it did
        when it came in a message of its own."""
        try:
            if "ids" in a:
                self._push(a)
        finally:
            self.set_clock(
                int(meta["rank"]), int(meta["clock"]), samples=int(meta.get("samples", 0))
            )

    def _push(self, a: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        store, n = self.ctx.store, a["ids"].numel()
        if a["cnt"].numel() != n or a["grad"].numel() != n * store.dim:
            raise ValueError(f"a push of {n} rows carries {a['cnt'].numel()} counts and "
                             f"{a['grad'].numel()} gradient values ({store.dim} per row)")  # fmt: skip
        code, slots, cnt, grad = answer.push_slots(
            self.own_slot, store.num_rows, a["ids"], a["cnt"], a["grad"], store.dim, store.device
        )  # (fresh host arrays: self.stage does not reuse its buffers)
        if code:
            raise ValueError(answer.MESSAGES[code])
        with self.lock:
            self.buffered.append((slots, cnt, grad))
        return {}

    def _count(self, direction: str, arrays: dict[str, torch.Tensor]) -> None:
        for name, t in arrays.items():
            kind = _KIND_OF[name]
            self.bytes[f"bytes_{direction}_{kind}"] += t.numel() * t.element_size()


_KINDS = ("ids", "versions", "values", "gradients")
# every array a request or reply carries, by counter kind (the lags count as versions)
_KIND_OF = {
    "mids": "ids", "rids": "ids", "ids": "ids", "mver": "versions", "cnt": "versions",
    "grad": "gradients", "lag": "versions", "values": "values", "versions": "versions",
    "state": "values",
}  # fmt: skip


def _own_slots(store: Any) -> torch.Tensor:
    """``[num_rows + 2]`` int32 on the host: entry ``1 + id`` is the slot of a row this rank
    owns, -1 for any other row and at both ends (the ids below 0 and above the table)."""
    own = store.slot_of.cpu().clone()
    own[(own < 0) | (own >= store.n_own)] = -1
    edge = torch.full((1,), -1, dtype=own.dtype, device=own.device)
    return torch.cat([edge, own, edge])
