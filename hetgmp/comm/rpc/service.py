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
device. Every message is checked before a handler sees it (:mod:`.schema`: its frames, then
the schema its operation was registered with); a bad one is answered with a refusal that names
this rank and counted by reason (:attr:`RpcService.refused`, in the run's counters as
``rpc_refused*``), and the service goes on: nothing a peer or a stranger sends ends it. A
handler may refuse a request too (``HANDLER_REFUSALS``); any other error in a handler is a bug
of this rank: it ends the thread, and every wait on the service
(:meth:`RpcService.check_peer`, waits on :attr:`RpcService.cv`) raises it.

Who may connect: on loopback anyone on this host; beyond loopback only the job's ranks, by
ZeroMQ CURVE (``keys``, :mod:`.security`: a ZAP handler admits only their public keys).

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
from hetgmp.comm.rpc.schema import REASONS, BadMessage, Field, Schema
from hetgmp.comm.rpc.security import CurveKeys
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
# The largest frame a service takes: ZeroMQ drops the connection of a peer that sends a larger
# one before it is received (a layer whose messages may be larger passes its own limit).
MAX_FRAME_BYTES = 256 << 20
# What a handler may raise for a request it cannot serve (answered with a refusal naming this
# rank and counted); anything else is a bug of this rank: it ends the thread (see above).
HANDLER_REFUSALS = (ValueError, KeyError, IndexError, RuntimeError)

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

    def __init__(
        self, rank: int, world_size: int, host: str, port: int, device: torch.device,
        keys: CurveKeys | None = None, max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:  # fmt: skip
        self.zmq = zmq = wire.import_zmq()
        self.rank, self.world_size, self.device, self.keys = rank, world_size, device, keys
        self.max_frame_bytes = max_frame_bytes
        self.stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        self.stage = HostStage(torch.device("cpu"), reuse=False)  # (fresh buffers: see above)
        # bad messages refused, by reason (hetgmp.comm.rpc.schema.REASONS); "reply": bad
        # answers this rank's requests got (Peers)
        self.refused: dict[str, int] = dict.fromkeys((*REASONS, "reply"), 0)
        self.zctx = zmq.Context()
        self.auth = _start_auth(self) if keys is not None else None
        self.sock = self.zctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # (a frame above it drops the connection in ZeroMQ, before it is all in memory)
        self.sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
        if keys is not None:
            self.sock.curve_secretkey, self.sock.curve_publickey = keys.secret, keys.public
            self.sock.curve_server = True
        self.endpoint = self._bind(host, port)
        self.handlers: dict[bytes, tuple[Handler, Schema]] = {}
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
        self.register(wire.BYE, self._bye, Schema({"rank": self.peer_field()}))

    def _bind(self, host: str, port: int) -> str:
        """Listen on ``host:port`` (0: a port the OS picks); the endpoint peers connect to."""
        try:
            if port:
                self.sock.bind(f"tcp://{host}:{port}")
            else:
                port = self.sock.bind_to_random_port(f"tcp://{host}")
        except self.zmq.ZMQError as err:
            self._close_sockets()
            raise CommError(f"rank {self.rank}: {self.title} cannot listen on {host}:{port} "
                            f"({err}){self.bind_hint}") from err  # fmt: skip
        return f"tcp://{host}:{port}"

    def peer_field(self, required: bool = True) -> Field:
        """A header field naming another rank of the job (never this one: its own clocks
        and goodbyes are set locally)."""
        return Field(int, 0, self.world_size - 1, required, exclude=self.rank)

    def register(self, op: bytes, handler: Handler, schema: Schema) -> None:
        """Answer requests ``op`` that fit ``schema`` by ``handler`` from now on (it replaces
        an earlier one); the others are refused and counted (:mod:`.schema`). Register before
        any peer may send ``op`` (before the barrier or meeting that lets them): an op nobody
        registered is refused."""
        if op == wire.REPLY:
            raise ValueError(f"{wire.REPLY!r} is the service's answer, not an operation")
        self.handlers[op] = (handler, schema)
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
        self._close_sockets()

    def _close_sockets(self) -> None:
        if not self.sock.closed:
            self.sock.close(linger=0)
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
        if not self.zctx.closed:
            self.zctx.term()

    def refusals(self) -> dict[str, int]:
        """Messages refused so far: ``rpc_refused`` (all) and ``rpc_refused_<reason>``."""
        out = {f"rpc_refused_{k}": v for k, v in self.refused.items()}
        out["rpc_refused"] = sum(self.refused.values())
        return out

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
        """A request's reply (None: a one-way message): the handler's answer, or a refusal
        for a message that is malformed, of an unknown operation, off its schema, or that the
        handler refused (each counted by reason in :attr:`refused`)."""
        try:
            op, meta, typed, raws = wire.decode(frames)
            entry = self.handlers.get(op)
            kind = op.decode(errors="replace") if entry is not None else "other"
            self.received[kind] = self.received.get(kind, 0) + 1
            if entry is None:
                raise BadMessage(f"unknown request {op[:16]!r}", "unknown")
            handler, schema = entry
            schema.validate(meta, wire.views(typed, raws))
            arrays = self.stage.receive(typed, raws)
        except BadMessage as err:
            return self._refuse(err.reason, err)
        try:
            out = handler(meta, arrays)
        except HANDLER_REFUSALS as err:
            return self._refuse("refused", err)
        return None if out is None else wire.pack(wire.REPLY, {}, out)

    def _refuse(self, reason: str, err: Exception) -> list[Any]:
        self.refused[reason] += 1
        return wire.pack(wire.REPLY, {"error": f"rank {self.rank}: {err}"}, {})


class _Keys:
    """The ZAP handler's question: is a client's public key one of the job's? (A refused
    one is counted as ``auth``.)"""

    def __init__(self, service: RpcService) -> None:
        assert service.keys is not None
        self.service, self.allowed = service, set(service.keys.ranks)

    def callback(self, domain: str, key: bytes) -> bool:
        ok = bytes(key) in self.allowed
        if not ok:
            self.service.refused["auth"] += 1
        return ok


def _start_auth(service: RpcService) -> Any:
    """The ZAP handler of ``service``'s context (a pyzmq thread that answers only at
    connection handshakes): CURVE clients whose public key is one of the job's ranks'."""
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(service.zctx)
    auth.start()
    auth.configure_curve_callback("*", credentials_provider=_Keys(service))
    return auth
