"""Dense parameters under ``--sync async`` without a lockstep meeting: a parameter server
spread over the ranks' RPC services (:mod:`hetgmp.comm.rpc`; its operation, :data:`DENSE`, is
registered on the service the async engine runs, ``engine.rpc``).

The dense parameters, flattened, are cut into ``W`` contiguous shards; rank ``p``'s service
holds the *served value* of shard ``p``. Every rank trains its own copy with its own optimizer
on its own gradient (the local mean loss's) and, every ``k`` steps (``--dense-sync-every k``),
exchanges with every shard owner, point to point and at its own pace:

* it sends its **delta** since its last pull (``copy - base``) for the owner's shard;
* the owner adds ``delta / W`` to the shard (under a lock, in its service thread) and answers
  with the shard's new value;
* the answers, put together, become the rank's new base, and its copy that base plus what it
  learned while the answers were on their way: the exchange is *overlapped*, sent after a
  step and taken at the next exchange, so the round trip hides behind the steps in between
  and the copy is one exchange behind the others' progress.

So the served value moves by the *mean* of the ranks' progress: at ``k = 1`` with SGD and ranks
in step it is the collective path's update (``-lr`` times the mean of the local gradients = the
global batch's gradient), one exchange late, and a slow rank adds its fewer deltas without
holding anyone up. The
optimizer states (Adam's moments) stay per rank. :meth:`DenseServer.finish` (collective, at the
end of training) pushes what is left, meets the other ranks (through the services:
:meth:`~hetgmp.embedding.rowservice.AsyncStep.meet`), pulls the final value and meets
them again, so every rank evaluates and saves the same model.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hetgmp.comm.collectives import barrier
from hetgmp.comm.env import DistEnv
from hetgmp.comm.rpc.schema import Array, BadMessage, Schema

if TYPE_CHECKING:
    from hetgmp.comm.rpc import Peers, Request
    from hetgmp.embedding.rowservice import AsyncStep

DENSE = b"dense"  # this server's operation: a shard's push-and-pull (delta -> value)


class DenseServer:
    """This rank's shard of the served dense value, and its copy's exchanges with the others.

    Construction is collective (every rank registers its shard before anyone exchanges)."""

    def __init__(
        self, env: DistEnv, params: list[nn.Parameter], engine: AsyncStep, every: int
    ) -> None:
        if every < 1:
            raise ValueError(f"--dense-sync-every must be >= 1, got {every}")
        self.env, self.params, self.engine, self.every = env, params, engine, every
        self.w, self.rank = env.world_size, env.rank
        # (views of one buffer: a snapshot and an update are one copy each, not one per tensor)
        self.flat = _flat_buffer(params)
        n = self.flat.numel()
        self.bounds = [n * i // self.w for i in range(self.w + 1)]
        # the value of the last pull (identical on every rank), where the parameters live: an
        # exchange moves the delta to the host and the answers back, nothing else (on CUDA)
        self.base = self.flat.detach().clone()
        lo, hi = self._span(self.rank)
        self.shard = self.base[lo:hi].cpu().clone()  # (host: the service thread's)
        self.lock = threading.Lock()  # the shard, shared with the service thread
        self.steps = 0
        self.exchanges = 0
        self.channel: Peers = (
            engine.peers.channel()
        )  # (its own sockets: an exchange stays in flight)
        self.inflight: tuple[torch.Tensor, torch.Tensor, list[int]] | None = None
        self.bytes_sent = 0  # delta bytes this rank sent to the other owners
        self.schema = self._shard_schema(self.rank, "delta")
        engine.rpc.register(DENSE, self._serve, self.schema)
        barrier(env)  # nobody exchanges before every shard is served

    def _span(self, p: int) -> tuple[int, int]:
        return self.bounds[p], self.bounds[p + 1]

    def _shard_schema(self, p: int, name: str) -> Schema:
        """A message of exactly shard ``p``'s values, all finite: a push (``delta``, to this
        rank's service) or its answer (``value``)."""
        lo, hi = self._span(p)

        def whole(meta: dict[str, Any], a: dict[str, Any]) -> None:
            if a[name].shape[0] != hi - lo:
                raise BadMessage(f"a dense {name} of {a[name].shape[0]} values for a shard of "
                                 f"{hi - lo}")  # fmt: skip

        return Schema({}, {name: Array("float32", max_len=hi - lo)}, whole)

    def _serve(self, meta: dict[str, Any], arrays: dict[str, torch.Tensor]) -> dict[str, Any]:
        """(service thread) add ``delta / W`` to the shard; answer with its new value."""
        delta = arrays["delta"].cpu()  # (arrives on the host, where the shard is: no copy)
        with self.lock:  # (its size and finite values: checked by self.schema)
            self.shard.add_(delta, alpha=1.0 / self.w)
            return {"value": self.shard.clone()}

    def after_step(self) -> None:
        """Count a local step; exchange every ``every`` steps (overlapped: see :meth:`send`)."""
        self.steps += 1
        if self.steps % self.every == 0:
            t0 = time.perf_counter()
            self.collect()
            self.send()
            self.engine.phase_s["dense"] += time.perf_counter() - t0

    @torch.no_grad()
    def send(self) -> None:
        """Push this rank's delta since its last pull to every shard's owner; the answers are
        taken by :meth:`collect` (the next exchange: the training steps in between overlap the
        round trip, and the copy keeps what it learns meanwhile)."""
        cur = self.flat.detach().clone()  # (on the device: the copy's value at sending)
        delta = cur - self.base
        reqs: dict[int, Request] = {}
        for p in range(self.w):
            lo, hi = self._span(p)
            if p != self.rank and hi > lo:  # (the channel copies them to its pinned buffer)
                reqs[p] = (DENSE, {}, {"delta": delta[lo:hi]})
                self.bytes_sent += 4 * (hi - lo)
        self.channel.send(reqs)
        lo, hi = self._span(self.rank)
        own = self._serve({}, {"delta": delta[lo:hi].cpu()})["value"]  # (the device is done)
        self.inflight = (cur, own, sorted(reqs))

    @torch.no_grad()
    def collect(self) -> None:
        """Take the answers of the exchange in flight: the copy becomes the served value plus
        what this rank learned since it sent, and the served value its new base."""
        if self.inflight is None:
            return
        sent_at, own, peers = self.inflight
        self.inflight = None
        answers = self.channel.collect(
            peers, "async dense exchange", lambda p: self._shard_schema(p, "value")
        )
        order = sorted({*peers, self.rank})
        dev = self.flat.device  # (answers arrive on it; the own shard's answer is a host one)
        new = torch.cat([(own if p == self.rank else answers[p]["value"]).to(dev) for p in order])
        # the served value + what this rank learned since sending (in this order: a pure pull,
        # nothing learned, leaves exactly the served value, the same on every rank)
        self.flat.sub_(sent_at).add_(new)
        self.base = new
        self.exchanges += 1

    def exchange(self) -> None:
        """One exchange, waited for (the one in flight first)."""
        self.collect()
        self.send()
        self.collect()

    def finish(self) -> None:
        """(Collective, once training has ended) push what is left, meet every rank, then
        pull the final value: every rank holds the same dense parameters afterwards."""
        self.exchange()
        self.engine.meet("async dense finish")  # every rank's last delta is in its shard
        self.exchange()  # (a zero delta: a pure pull)
        self.engine.meet("async dense pull")  # (nobody's pull in flight: collectives may follow)

    def stats(self) -> dict[str, int]:
        """Exchanges and delta bytes sent by this rank (for the results)."""
        return {"dense_exchanges": self.exchanges, "dense_bytes_sent": self.bytes_sent}


def _flat_buffer(params: list[nn.Parameter]) -> torch.Tensor:
    """The one float32 buffer ``params`` are views of, in order (FlatAdam's on CUDA); made so
    if they are not (before the first step: the optimizers keep working on the views)."""
    if not params:
        return torch.zeros(0)
    base = params[0].untyped_storage()
    offset, views = 0, True
    for p in params:
        views = views and p.dtype == torch.float32 and p.is_contiguous()
        views = views and p.untyped_storage().data_ptr() == base.data_ptr()
        views = views and p.storage_offset() == offset
        offset += p.numel()
    if views and base.nbytes() == 4 * offset:
        return torch.empty(0, device=params[0].device).set_(base, 0, (offset,), (1,))
    if any(p.dtype != torch.float32 for p in params):
        raise ValueError("the async dense server needs float32 dense parameters")
    from hetgmp.train.flat_adam import flatten_parameters

    return flatten_parameters(params)
