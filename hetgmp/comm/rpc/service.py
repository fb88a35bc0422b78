"""A rank's RPC service: a thread with a ZeroMQ ROUTER socket that answers the other ranks'
requests by the handlers any layer registers on it (:meth:`RpcService.register`).

One service (one socket, one thread) per rank serves every layer that talks point to point
under ``--sync async``: the row service of the embedding table
(:mod:`hetgmp.embedding.rowservice`: reads, pushes and clocks of the rows this rank owns; it
is this class extended, :class:`~hetgmp.embedding.rowservice.service.RowService`), the dense
parameter server (:mod:`hetgmp.train.dense_server`) and work stealing
(:mod:`hetgmp.train.work_steal`). Requests come from the peers' DEALER sockets
(:mod:`.peers`); messages are :mod:`.wire` frames.

A handler runs on the service thread: ``handler(meta, arrays)`` -> the reply's arrays (host
tensors), or None for a one-way message (no reply). The arrays of a request arrive in host
memory, in fresh buffers (a handler may keep them); a handler moves what it needs to its
device. A bad request (``ValueError``, ``KeyError``, ``IndexError``, ``RuntimeError``) is
answered with a refusal that names this rank; any other error ends the thread, and every wait
on the service (:meth:`RpcService.check_peer`, waits on :attr:`RpcService.cv`) raises it.

A peer that closes its sockets says so (:data:`.wire.BYE`): a wait for its answers then fails
at once instead of at the timeout. On CUDA the thread runs on a CUDA stream of its own
(``stream``); its handlers order themselves with the other threads' streams.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from hetgmp.comm.errors import CommError
from hetgmp.comm.rpc import wire
from hetgmp.comm.rpc.stage import HostStage

POLL_MS = 50  # how often the service thread looks at its stop flag
# The interpreter's GIL switch interval while a service runs, and while it answers a request.
# The service shares the interpreter with the training thread: answering takes the GIL back
# after each of its ZeroMQ and torch calls, and a training thread that runs Python (on CUDA:
# launching kernels) keeps it until the interval forces a switch. Measured when an answer made
# about a hundred such calls (bench/results/async_gil.md, 2 CPU ranks, the peer's training
# thread in a pure-Python loop, 64 x 26 ids): a read took 454 ms with CPython's default 5 ms,
# 9-14 ms with 100 us, 8.3-9.3 ms with 5 us while answering, 1.2 ms with the peer idle. The
# row service's arithmetic is scripted now (hetgmp.embedding.rowservice.answer: no GIL), which
# leaves about a dozen (socket frames, header, one scripted call); the short interval still
# bounds what each of them waits. Outside an answer the interval stays at 100 us, so the
# training thread and its data loader thread do not switch every 5 us.
SWITCH_INTERVAL_S = 1e-4
ANSWER_SWITCH_INTERVAL_S = 5e-6
THREAD_PREFIX = "hetgmp-async-service"

# handler(meta, arrays) -> the reply's arrays, or None: no reply (service thread)
Handler = Callable[[dict[str, Any], dict[str, torch.Tensor]], dict[str, torch.Tensor] | None]


class RpcService:
    """The service of one rank: bound on ``host:port`` (0: a port the OS picks) at
    construction, serving from :meth:`start` until :meth:`close`. ``device``: where the
    requesters' side (:class:`~.peers.Peers`) lays out answers, and on CUDA the device of the
    thread's stream."""

    title = "the rank's RPC service"  # (how errors name this service)
    peer_left = "closed its service"  # (what a peer that said goodbye did, in errors)
    bind_hint = ""  # (appended to the error when the address is taken: which option moves it)

    def __init__(self, rank: int, host: str, port: int, device: torch.device) -> None:
        self.zmq = zmq = wire.import_zmq()
        self.rank, self.device = rank, device
        self.stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        self.stage = HostStage(torch.device("cpu"), reuse=False)  # (fresh buffers: see above)
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
                f"rank {rank}: {self.title} cannot listen on {host}:{port} ({err}){self.bind_hint}"
            ) from err
        self.endpoint = f"tcp://{host}:{port}"
        self.handlers: dict[bytes, Handler] = {}
        # messages received by kind (the op; "other": unknown ones): each one takes the GIL
        # from the training thread, so fewer a step is faster
        self.received: dict[str, int] = {"other": 0}
        # (notified when a peer leaves or the thread fails; subclasses wait on it for more)
        self.cv = threading.Condition()
        self.gone: set[int] = set()  # ranks that said goodbye (failed or finished)
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._switch = 0.0  # the interpreter's switch interval before start(), if it set one
        self._ours = -1.0  # the one start() set
        self.thread = threading.Thread(
            target=self._run, name=f"{THREAD_PREFIX}-{rank}", daemon=True
        )
        self.register(wire.BYE, self._bye)

    def register(self, op: bytes, handler: Handler) -> None:
        """Answer requests ``op`` by ``handler`` from now on (it replaces an earlier one).
        Register before any peer may send ``op`` (before the barrier or meeting that lets
        them): an op nobody registered is refused."""
        if op == wire.REPLY:
            raise ValueError(f"{wire.REPLY!r} is the service's answer, not an operation")
        self.handlers[op] = handler
        self.received.setdefault(op.decode(), 0)

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

    # ------------------------------------------------------------------ peers
    def mark_gone(self, rank: int) -> None:
        """``rank`` has closed its sockets: waits for it fail from now on."""
        with self.cv:
            self.gone.add(rank)
            self.cv.notify_all()

    def check_peer(self, peer: int, what: str) -> None:
        """Raise if ``peer`` has said goodbye or this service has failed."""
        if self.failure is not None:
            raise CommError(f"rank {self.rank}: {self.title} failed") from self.failure
        if peer in self.gone:
            raise CommError(
                f"rank {self.rank}: {what}: rank {peer} {self.peer_left} (it failed or left "
                "early) while this rank still needed it"
            )

    def _bye(self, meta: dict[str, Any], arrays: dict[str, torch.Tensor]) -> None:
        self.mark_gone(int(meta["rank"]))

    # ------------------------------------------------------------------ the thread
    def _on_device(self) -> contextlib.AbstractContextManager[Any]:
        """The thread's CUDA device and stream (both are per thread), or nothing on the CPU."""
        if self.stream is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.device(self.device))
        stack.enter_context(torch.cuda.stream(self.stream))
        return stack

    def _run(self) -> None:
        poller = self.zmq.Poller()
        poller.register(self.sock, self.zmq.POLLIN)
        try:
            with self._on_device():
                self._serve(poller)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting threads
            self.failure = err
            with self.cv:
                self.cv.notify_all()

    def _serve(self, poller: Any) -> None:
        while not self._stop.is_set():
            if not poller.poll(POLL_MS):
                continue
            frames = self.sock.recv_multipart()
            reply = self._answer(frames[1:])
            if reply is not None:
                self.sock.send_multipart([frames[0], *reply])

    def _answer(self, frames: list[bytes]) -> list[Any] | None:
        """:meth:`_handle` with the short switch interval (see ``ANSWER_SWITCH_INTERVAL_S``)."""
        if not self._switch:  # (the interval is not this service's to change)
            return self._handle(frames)
        sys.setswitchinterval(ANSWER_SWITCH_INTERVAL_S)
        try:
            return self._handle(frames)
        finally:
            sys.setswitchinterval(SWITCH_INTERVAL_S)

    def _handle(self, frames: list[bytes]) -> list[Any] | None:
        try:
            op, meta, arrays = wire.unpack(frames, self.stage)
            handler = self.handlers.get(op)
            kind = op.decode() if handler is not None else "other"
            self.received[kind] = self.received.get(kind, 0) + 1
            if handler is None:
                raise ValueError(f"unknown request {op[:16]!r}")
            out = handler(meta, arrays)
            return None if out is None else wire.pack(wire.REPLY, {}, out)
        except (ValueError, KeyError, IndexError, RuntimeError) as err:
            return wire.pack(wire.REPLY, {"error": f"rank {self.rank}: {err}"}, {})
