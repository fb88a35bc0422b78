"""The training thread's side of ``--sync async``: one ZeroMQ DEALER socket per peer,
connected to the endpoints the ranks published at start (:func:`connect_peers`).

Requests to several owners go out together and their answers are collected in any order; each
socket carries at most one request at a time (a step sends one read, or one push, per owner),
so the answer on a socket is the answer to its request. Arrays go out from, and answers come in
to, the table's device through this thread's :class:`~.async_stage.HostStage` (pinned buffers
on CUDA). Clock messages have no answer. A peer
that does not answer within the timeout, or that said it closed its table, is a
:class:`~hetgmp.comm.errors.CommError` naming it.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from hetgmp.comm.collectives import all_gather_object
from hetgmp.comm.env import DistEnv
from hetgmp.comm.errors import CommError
from hetgmp.embedding.transport import async_wire as wire
from hetgmp.embedding.transport.async_service import AsyncService
from hetgmp.embedding.transport.async_stage import HostStage

SLICE_MS = 100  # waits are cut in slices to notice a peer that said it closed
CLOSE_LINGER_MS = 500  # how long a closing socket may still deliver its last message

Request = tuple[bytes, dict[str, Any], dict[str, torch.Tensor]]


class Peers:
    """DEALER sockets to every other rank's service (``endpoints`` in rank order)."""

    def __init__(
        self, env: DistEnv, service: AsyncService, endpoints: list[str], timeout_s: float
    ) -> None:
        zmq = service.zmq
        self.rank, self.service, self.timeout_s = env.rank, service, timeout_s
        self.stage = HostStage(service.ctx.store.device)  # (the training thread's)
        self.socks: dict[int, Any] = {}
        for p, ep in enumerate(endpoints):
            if p != env.rank:
                s = service.zctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, CLOSE_LINGER_MS)
                s.connect(ep)
                self.socks[p] = s

    def request_all(self, reqs: dict[int, Request], what: str) -> dict[int, dict[str, Any]]:
        """Send every request, then collect every answer: ``{peer: arrays}`` (on the table's
        device)."""
        hosts = self.stage.to_host([arrays for _, _, arrays in reqs.values()])
        for (p, (op, meta, _)), host in zip(reqs.items(), hosts, strict=True):
            self.socks[p].send_multipart(wire.pack(op, meta, host))
        self.stage.begin_receive()
        out = {}
        for p in reqs:
            out[p] = self._answer(p, what)
        return out

    def _answer(self, p: int, what: str) -> dict[str, Any]:
        sock, deadline = self.socks[p], time.monotonic() + self.timeout_s
        while not sock.poll(SLICE_MS):
            self.service.check_peer(p, what)
            if time.monotonic() > deadline:
                raise CommError(
                    f"rank {self.rank}: {what}: rank {p} did not answer within "
                    f"{self.timeout_s:.0f}s; it probably died or hangs"
                )
        _, meta, arrays = wire.unpack(sock.recv_multipart(), self.stage)
        if "error" in meta:
            raise CommError(f"rank {self.rank}: {what}: rank {p} refused: {meta['error']}")
        return arrays

    def publish_clock(self, clock: int, *, gone: bool = False, samples: int = 0) -> None:
        """Tell every peer's service this rank's clock and training samples taken so far
        (``gone``: it closes its table)."""
        meta = {"rank": self.rank, "clock": clock, "gone": gone, "samples": samples}
        msg = wire.pack(wire.CLOCK, meta, {})
        for s in self.socks.values():
            s.send_multipart(msg)

    def close(self) -> None:
        """Say goodbye, then close every socket (the last message may linger briefly)."""
        if any(not s.closed for s in self.socks.values()):
            self.publish_clock(-1, gone=True)
        for s in self.socks.values():
            if not s.closed:
                s.close()


def connect_peers(env: DistEnv, service: AsyncService, timeout_s: float) -> tuple[Peers, list[str]]:
    """Publish this rank's endpoint through the launch's process group (collective), start the
    service and connect to every peer's."""
    endpoints = [str(e) for e in all_gather_object(env, service.endpoint)]
    service.start()
    return Peers(env, service, endpoints, timeout_s), endpoints
