"""The requesting side of a rank's RPC service: one ZeroMQ DEALER socket per peer, connected
to the endpoints the ranks published at start (:func:`connect_peers`).

Requests to several peers go out together and their answers are collected in any order. A
socket may carry several requests: the peer's service answers one connection's messages in
order, so answers come back in the order of their requests. An acknowledgement may be left
*owed* (:meth:`Peers.send_acked`): it is taken, and its error raised, before the next answer
from that peer or at :meth:`Peers.settle`; a request followed by another on the same socket is
handled before it all the same. :meth:`Peers.channel` opens a second set of sockets with its
own buffers, for exchanges that overlap others (the dense parameters). Arrays go out from, and
answers come in to, the service's device through this thread's :class:`~.stage.HostStage`
(pinned buffers on CUDA). One-way messages (:meth:`Peers.publish`) have no answer. A peer that
does not answer within the timeout, or that said goodbye, is a
:class:`~hetgmp.comm.errors.CommError` naming it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container
from typing import Any

import torch

from hetgmp.comm.collectives import all_gather_object
from hetgmp.comm.env import DistEnv
from hetgmp.comm.errors import CommError
from hetgmp.comm.rpc import wire
from hetgmp.comm.rpc.schema import BadMessage, Schema
from hetgmp.comm.rpc.service import RpcService
from hetgmp.comm.rpc.stage import HostStage

SLICE_MS = 100  # waits are cut in slices to notice a peer that said it closed
CLOSE_LINGER_MS = 500  # how long a closing socket may still deliver its last message

Request = tuple[bytes, dict[str, Any], dict[str, torch.Tensor]]
Expect = Callable[[int], Schema]  # the schema peer p's answer must fit
ACK = Schema()  # a bare acknowledgement: no field, no array


class Peers:
    """DEALER sockets to every other rank's service (``endpoints`` in rank order)."""

    def __init__(
        self, env: DistEnv, service: RpcService, endpoints: list[str], timeout_s: float
    ) -> None:
        zmq = service.zmq
        self.rank, self.service, self.timeout_s = env.rank, service, timeout_s
        self.env, self.endpoints = env, endpoints
        self.stage = HostStage(service.device)  # (the requesting thread's)
        self.socks: dict[int, Any] = {}
        self.owed: dict[int, list[str]] = {}  # per peer: requests whose acks are not yet taken
        self.channels: list[Peers] = []
        self.announce = True  # (close says goodbye; a channel's close does not)
        self.wait_s = 0.0  # seconds spent waiting for (and taking) the peers' answers
        for p, ep in enumerate(endpoints):
            if p != env.rank:
                s = service.zctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, CLOSE_LINGER_MS)
                keys = service.keys
                if keys is not None:  # (CURVE: this rank's keys, and the peer's it checks)
                    s.curve_publickey, s.curve_secretkey = keys.public, keys.secret
                    s.curve_serverkey = keys.ranks[p]
                s.connect(ep)
                self.socks[p] = s

    def request_all(
        self, reqs: dict[int, Request], what: str, expect: Expect | None = None
    ) -> dict[int, dict[str, Any]]:
        """Send every request, then collect every answer: ``{peer: arrays}`` (on the table's
        device), each fitting ``expect(peer)`` (:meth:`collect`)."""
        self.send(reqs)
        return self.collect(list(reqs), what, expect)

    def send(self, reqs: dict[int, Request]) -> None:
        """Send every request; their answers are for :meth:`collect` (in the same order)."""
        hosts = self.stage.to_host([arrays for _, _, arrays in reqs.values()])
        for (p, (op, meta, _)), host in zip(reqs.items(), hosts, strict=True):
            self.socks[p].send_multipart(wire.pack(op, meta, host))

    def collect(
        self, peers: list[int], what: str, expect: Expect | None = None
    ) -> dict[int, dict[str, Any]]:
        """The answers of ``peers`` to the requests :meth:`send` sent them last (their owed
        acknowledgements first); the arrays of an earlier collect may be overwritten.
        ``expect(p)``: the schema peer ``p``'s answer must fit (default: no arrays); an
        answer that does not is counted and raised (a peer of the job answered garbage)."""
        self.stage.begin_receive()
        return {p: self._answer(p, what, expect) for p in peers}

    def send_acked(self, reqs: dict[int, Request], what: str) -> None:
        """Send requests whose answers are bare acknowledgements, and leave them owed."""
        self.send(reqs)
        for p in reqs:
            self.owed.setdefault(p, []).append(what)

    def settle(self) -> None:
        """Take every owed acknowledgement (raising a refusal's error)."""
        for p in list(self.owed):
            self._take_owed(p)

    def channel(self) -> Peers:
        """Another DEALER socket to every peer's service, with its own host buffers: requests
        on it neither wait for nor delay this set's answers. Closed with this set."""
        ch = Peers(self.env, self.service, self.endpoints, self.timeout_s)
        ch.announce = False
        self.channels.append(ch)
        return ch

    def _take_owed(self, p: int) -> None:
        for what in self.owed.pop(p, []):
            self._receive(p, what)

    def _answer(self, p: int, what: str, expect: Expect | None) -> dict[str, Any]:
        if p in self.owed:
            self._take_owed(p)
        return self._receive(p, what, expect)

    def _receive(self, p: int, what: str, expect: Expect | None = None) -> dict[str, Any]:
        sock, t0 = self.socks[p], time.monotonic()
        deadline = t0 + self.timeout_s
        try:
            return self._take(sock, p, what, deadline, expect(p) if expect else ACK)
        finally:
            self.wait_s += time.monotonic() - t0

    def _take(
        self, sock: Any, p: int, what: str, deadline: float, schema: Schema
    ) -> dict[str, Any]:
        while not sock.poll(SLICE_MS):
            self.service.check_peer(p, what)
            if time.monotonic() > deadline:
                raise CommError(
                    f"rank {self.rank}: {what}: rank {p} did not answer within "
                    f"{self.timeout_s:.0f}s; it probably died or hangs"
                )
        frames = sock.recv_multipart()
        try:
            op, meta, typed, raws = wire.decode(frames)
            if op != wire.REPLY:
                raise BadMessage(f"a {op[:16]!r} message instead of an answer")
            if "error" in meta:  # (a refusal: its text is the peer's)
                raise CommError(f"rank {self.rank}: {what}: rank {p} refused: "
                                f"{str(meta['error'])[:500]}")  # fmt: skip
            schema.validate(meta, wire.views(typed, raws))
        except BadMessage as err:
            self.service.refused["reply"] += 1
            raise CommError(f"rank {self.rank}: {what}: rank {p} answered a bad message ({err})"
                            ) from None  # fmt: skip
        return self.stage.receive(typed, raws)

    def publish(self, op: bytes, meta: dict[str, Any], skip: Container[int] = ()) -> None:
        """A one-way message ``op`` (no answer) to every peer not in ``skip``."""
        msg = wire.pack(op, meta, {})
        for p, s in self.socks.items():
            if p not in skip:
                s.send_multipart(msg)

    def close(self) -> None:
        """Say goodbye, then close every socket (the last message may linger briefly)."""
        for ch in self.channels:
            ch.close()
        if self.announce and any(not s.closed for s in self.socks.values()):
            self.publish(wire.BYE, {"rank": self.rank})
        for s in self.socks.values():
            if not s.closed:
                s.close()


def connect_peers(env: DistEnv, service: RpcService, timeout_s: float) -> tuple[Peers, list[str]]:
    """Publish this rank's endpoint through the launch's process group (collective), start the
    service and connect to every peer's."""
    endpoints = [str(e) for e in all_gather_object(env, service.endpoint)]
    service.start()
    return Peers(env, service, endpoints, timeout_s), endpoints
