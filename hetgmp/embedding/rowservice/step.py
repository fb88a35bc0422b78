"""``--sync async``: a multi-rank step without a global exchange (HET's way: each rank serves
its owned rows from a ZeroMQ service thread, :mod:`.service`; workers refresh, fetch and
push point to point, :mod:`hetgmp.comm.rpc.peers`). The same step interface as
:class:`~hetgmp.embedding.collective.stepper.Stepper` (``step``, ``grads``), and the same rules
(:mod:`..protocol`).

A training step ``t`` of one rank has two phases, each ended by a tick of the rank's *clock*
(``2t + 1`` after the push phase, ``2t + 2`` after the read phase), published to every peer:

1. **push** (the last step's gradient): mirrors stage it (write rule) and the due ones push;
   owned rows are updated here at once; rows not stored here push to their owners. Owners
   acknowledge a push once it is buffered for their next read. With ``max_lag = 0`` the rank
   waits for the acknowledgements before its clock moves on. Otherwise push, clock tick and
   read go to each owner as **one message** (the owner buffers the push, moves the sender's
   clock, then answers the read: the answer acknowledges the push; a peer with nothing to read
   gets the push alone, its acknowledgement taken later, or the clock alone), after one wait
   for both phases' clock targets; the read phase's clock (``2t + 2``) is then set locally and
   told with the next step's messages (or :meth:`AsyncStep.commit`'s, near the budget). Every
   peer then sees one message and one answer a step instead of a push, its acknowledgement,
   three clock messages (the commit's among them) and the read. A rank's own later reads
   still see its pushes (one socket per owner, answered in order), the per-row bound is
   measured at the owner, and a clock a peer sees is at most one behind the rank's at any
   wait, so no two ranks wait for each other when ``max_lag >= 1``.
2. **read**: owned rows are read locally; one read request per owner carries the batch's mirror
   ids with their versions and the rows not stored here; the owner answers with every mirror's
   lag and the values of the mirrors beyond ``bound`` and of the rows not stored; stale
   mirrors are refreshed (owner value + own unpushed delta) and the rows gathered.

**Per-clock bound** (stale synchronous parallel): before the phase that ends at clock ``c``, a
rank waits until every rank's clock is at least ``c - 1 - 2 * max_lag``. So no rank is more
than ``max_lag`` steps ahead of the slowest, and with ``max_lag = 0`` every read of step ``t``
sees every rank's step ``t - 1`` update and none of step ``t``: with ``bound = 0`` that is the
collective path's arithmetic (SGD and row-wise Adagrad: owners buffer the pushes and their own
rows' gradient and apply them in one update per row before the next read, see
:meth:`RowService.drain`; equal up to float summation order).

**Reads sent ahead** (:meth:`AsyncStep.send_ahead`): the training loop of unequal steps
(:mod:`hetgmp.train.async_loop`) runs a step's push phase, clock tick, wait, drain and read
requests right after the previous step's backward, for the next batch, and the next forward
takes the answers: the same phases in the same order at the owners, only earlier, so the
round trip overlaps the optimizer, the dense exchange and the next batch's loading. A forward
given other ids drops them (their push stands).

``max_lag = -1`` lifts the per-clock bound (no clock waits; the per-row ``bound`` still holds).
The clock messages also carry the training samples each rank has taken (:meth:`AsyncStep.commit`)
so that every rank sees the run's global progress (the budget stop rule of
:mod:`hetgmp.train.async_loop`); a rank that stops training sets its clock to ``DONE_CLOCK``
(:meth:`AsyncStep.finish`), so no peer waits for it any more.

Evaluation reads (bound 0) and :meth:`AsyncStep.step` with ``OP_FLUSH`` do not move the clock,
but their push phase waits as a training step's does (its pushes must not reach an owner while
a peer still reads the step before); flush pushes everything pending and then meets every
rank (:meth:`AsyncStep.meet`, through the services), so owners hold every update afterwards
(flush is collective, as in the collective path).

**Meetings before process-group collectives.** Where a run goes from point-to-point traffic to
a collective of the process group (the end of training, of a flush, of an evaluation), the
ranks first meet through their services: each arrives once its own requests are answered, so
no rank enters a collective while a peer still needs its service. On CUDA a NCCL collective
that waits for a peer sits in the same GPU as the service's work for that peer; a run on 2 H100s
once hung there until the timeout (suspected, not proven), which meeting first rules out.

The same code runs on CPU and CUDA ranks (``device = store.device``): on CUDA the rows stay on
the device and messages pass through pinned host buffers (:mod:`hetgmp.comm.rpc.stage`).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import Any

import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.rpc.peers import Request, connect_peers
from hetgmp.comm.rpc.security import negotiate
from hetgmp.comm.rpc.service import RpcService
from hetgmp.embedding import protocol
from hetgmp.embedding.batch import Batch, Prep, range_error
from hetgmp.embedding.context import OP_FLUSH, OP_FORWARD, StepContext
from hetgmp.embedding.errors import EmbeddingInputError
from hetgmp.embedding.rowservice import wire
from hetgmp.embedding.rowservice.config import AsyncConfig
from hetgmp.embedding.rowservice.lock import TableLock
from hetgmp.embedding.rowservice.push import push_requests
from hetgmp.embedding.rowservice.reads import SentReads, drop_reads, receive_reads, send_reads
from hetgmp.embedding.rowservice.service import RowService

DONE_CLOCK = 2**62  # the clock of a rank that trains no more (above every real clock)
# How near the budget a commit is told at once (AsyncStep.commit): within COMMIT_MARGIN x (a
# batch per rank + what the other ranks train during one step of this rank). Before that a
# peer's view of a rank's samples may lag by a batch or two for one of its steps (the count
# rides on its next step's messages): three such windows keep the views exact wherever the
# stop rule looks at them, unless the others suddenly train three times faster. The others'
# progress per step is a peak that decays by COMMIT_DECAY a step (warm-up steps fade).
COMMIT_MARGIN = 3
COMMIT_DECAY = 0.9


@dataclasses.dataclass
class _Reading:
    """A step between its reads sent and their answers taken."""

    prep: Prep
    sent: SentReads
    deferred: torch.Tensor
    evaluating: bool


class AsyncStep:
    """The asynchronous step engine of one rank (see the module docstring). Construction is
    collective (the endpoints are published through the process group)."""

    def __init__(self, ctx: StepContext, cfg: AsyncConfig) -> None:
        env = ctx.env
        self.ctx, self.cfg = ctx, cfg
        self.lock = TableLock(ctx.store.device)  # the table, shared with the service thread
        port = cfg.port_base + env.rank if cfg.port_base else 0
        sec = negotiate(env, cfg.host, cfg.auth)  # (collective: where to listen, CURVE keys)
        self.service = RowService(ctx, self.lock, sec.host, port, sec.keys)
        try:
            self.peers, self.endpoints = connect_peers(env, self.service, cfg.timeout_s)
        except BaseException:
            self.service.close()
            raise
        self.grads: tuple[Batch, torch.Tensor] | None = None
        self.ahead: _Reading | None = None  # reads sent ahead for the next step (send_ahead)
        self.steps = 0  # training steps taken (the clock is 2 * steps between steps)
        self.samples = 0  # training samples this rank has taken (published with its clock)
        self.batch_max = 0  # the largest batch committed (commit's margin)
        self.others_seen = 0  # the other ranks' samples as last seen at a commit
        self.others_step = 0.0  # what they trained during one of this rank's steps (peak)
        self.closed = False
        # wall seconds of the training thread by phase (``clock_wait``, of which
        # ``clock_wait_in_step`` inside a step, ``push``, ``read``; the loop adds ``step``,
        # ``dense`` and ``steal``): where an async step's time goes
        self.phase_s: dict[str, float] = defaultdict(float)

    def step(
        self, prep: Prep, *, op: int, error: str | None, training: bool
    ) -> tuple[torch.Tensor, Batch]:
        """One step (forward or flush); returns the unique rows' values in block order. A
        step whose reads were sent ahead (:meth:`send_ahead`, the same ``prep``) collects
        them; reads sent ahead for another batch are dropped first."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            if ahead.prep is prep and op != OP_FLUSH and training:  # (as it was sent)
                return self._complete(ahead)
            self._drop(ahead)
        begun = self._begin(prep, op=op, error=error, training=training)
        return begun if isinstance(begun, tuple) else self._complete(begun)

    def send_ahead(self, prep: Prep) -> None:
        """(Training, after backward) push this step's gradient and send the reads of the next
        batch ``prep`` now, so their round trip overlaps the rest of this step (optimizer, dense
        exchange, the next batch's loading); the next :meth:`step` given the same ``prep``
        takes the answers. The same phases, clocks and waits as a step, in the same order at
        the owners: only earlier. A problem with ``prep`` is left for that step to report."""
        self.drop_ahead()
        if bool(prep.bad):
            return
        begun = self._begin(prep, op=OP_FORWARD, error=None, training=True, checked=True)
        assert not isinstance(begun, tuple)  # (only a flush ends in its push phase)
        self.ahead = begun

    def drop_ahead(self) -> None:
        """Take and drop the answers of reads sent ahead for a step that will not run (the
        end of training): no answer stays owed when the ranks meet."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            self._drop(ahead)

    def _begin(
        self, prep: Prep, *, op: int, error: str | None, training: bool, checked: bool = False
    ) -> _Reading | tuple[torch.Tensor, Batch]:
        """A step up to its reads sent: checks (``checked``: ``prep.bad`` was), the push
        phase, the clocks, the drain; a flush ends here (its result)."""
        ctx, r = self.ctx, self.ctx.env.rank
        if self.closed:
            raise RuntimeError(f"rank {r}: this table's async service is closed")
        if error is None and not checked and bool(prep.bad):
            error = range_error(prep.ids, ctx.store.num_rows)
        if error:  # (the pending gradient stays for the next step, as in the collective path)
            raise EmbeddingInputError(f"rank {r}: {error}")
        evaluating = op == OP_FLUSH or not training
        grads, self.grads = self.grads, None
        lag2, c = 2 * self.cfg.max_lag, 2 * self.steps
        riding = self._riding(evaluating)  # (push, clock and read in one message per owner)
        # (also before a flush or evaluation: its pushes must not reach an owner while a peer
        # still reads this step's values, or that peer sees an update from its future)
        if self.cfg.max_lag >= 0:
            self._wait(c + riding - lag2, "flush" if op == OP_FLUSH else "push")
        t0, w0 = time.perf_counter(), self.peers.wait_s
        pushes, deferred = self._push_phase(grads, evaluating, send=not riding)
        self._phase("push", t0, w0)
        if op == OP_FLUSH:
            self.meet("async flush")  # every rank's pushes are in before anyone reads owners
            self.service.drain()
            self.lock.fence()  # (CUDA: reads of the table after flush follow the service's work)
            return self._flushed(prep, deferred)
        tick = None
        if riding:  # (told with the reads)
            tick = {"rank": r, "clock": c + 1, "samples": self.samples}
            self._tick(c + 1, tell=False)
        elif not evaluating:
            self._tick(c + 1)
            if self.cfg.max_lag >= 0:
                self._wait(c + 1 - lag2, "read")
        bound = 0 if evaluating else ctx.bound
        planned = _batch(prep, ctx.env.rank, ctx.env.world_size)
        t0, w0 = time.perf_counter(), self.peers.wait_s
        self.service.drain()  # (this step's own rows and the pushes, one update per row)
        sent = send_reads(ctx, self.lock, self.peers, planned, bound, pushes, tick)
        self._phase("read", t0, w0)
        return _Reading(prep, sent, deferred, evaluating)

    def _phase(self, name: str, t0: float, w0: float) -> None:
        """Time since ``t0`` into phase ``name``, and the waits for peers' answers inside it
        into ``peer_wait`` (answers owed from elsewhere, e.g. a clock message's, are taken in
        other phases: not the exchanges')."""
        self.phase_s[name] += time.perf_counter() - t0
        self.phase_s["peer_wait"] += self.peers.wait_s - w0

    def _complete(self, reading: _Reading) -> tuple[torch.Tensor, Batch]:
        """The rest of a step: the answers taken, mirrors refreshed, rows gathered, clock."""
        t0, w0 = time.perf_counter(), self.peers.wait_s
        values = receive_reads(self.ctx, self.lock, self.peers, reading.sent, reading.deferred)
        self._phase("read", t0, w0)
        if not reading.evaluating:
            # (riding: told with the next step's messages, or its commit)
            self._tick(2 * self.steps + 2, tell=not self._riding(False))
            self.steps += 1
        return values, reading.sent.batch

    def _drop(self, reading: _Reading) -> None:
        """Reads sent ahead for a batch no step took: their answers are taken and dropped (the
        step's push and clock stand: its gradient is in, it just read nothing)."""
        drop_reads(self.ctx, self.peers, reading.sent)

    def close(self) -> None:
        """Tell the peers, close the sockets, stop the service thread, end the ZeroMQ context."""
        if self.closed:
            return
        self.closed = True
        self.ahead = None  # (their answers go with the sockets)
        try:
            self.peers.close()
        finally:
            self.service.close()

    # ------------------------------------------------------------------ the budget rule
    def commit(self, samples: int, budget: int | None = None) -> None:
        """This rank takes a batch of ``samples`` for its next step: count them and tell the
        peers (the clock stays). With ``budget`` (the run's global samples) and the step's
        count riding on its messages (``--max-lag`` != 0), they are told at once only near
        the budget (``COMMIT_MARGIN``): elsewhere the count reaches them with the next step's
        messages, a step late, which the stop rule can afford until the sum nears the budget
        (one clock message a step fewer to each peer). A straggler, whose steps are long next
        to the others', has a wide margin and tells them at once."""
        self.samples += samples
        self.batch_max = max(self.batch_max, samples)
        r, w = self.ctx.env.rank, self.ctx.env.world_size
        seen = sum(self.service.samples)
        # (what the others trained during this rank's last step, its recent peak: a slow rank
        # hides its count for one of its own steps, during which they may train far more
        # than a batch each, so its margin grows with them)
        others = seen - self.service.samples[r]
        gain, self.others_seen = others - self.others_seen, others
        self.others_step = max(gain, COMMIT_DECAY * self.others_step)
        margin = COMMIT_MARGIN * (w * self.batch_max + self.others_step)
        near = seen + margin >= (budget or 0)
        self._tick(2 * self.steps, tell=near or not self._riding(False))

    def wait_turn(self, budget: int) -> bool:
        """Before a training step: wait until the per-clock bound lets this rank start it
        (True), or until the samples of all ranks add up to ``budget`` (False: stop)."""
        lag = self.cfg.max_lag
        target = 2 * (self.steps - lag) if lag >= 0 else 0
        t0 = time.perf_counter()
        go = self.service.wait_clock(target, self.cfg.timeout_s, "async step (--max-lag)", budget)
        self.phase_s["clock_wait"] += time.perf_counter() - t0
        return go

    def finish(self) -> None:
        """This rank trains no more: its clock becomes ``DONE_CLOCK`` (no peer waits for it)."""
        self._tick(DONE_CLOCK)

    def meet(self, what: str) -> None:
        """(Collective) wait until every rank has arrived here, through the services, not the
        process group. A rank arrives once its own requests are all answered, so afterwards no
        request is in flight anywhere and a process-group collective may follow (see the
        module docstring)."""
        self.peers.settle()  # (acknowledgements still owed are requests in flight)
        r = self.ctx.env.rank
        meet, clock = self.service.meets[r] + 1, self.service.clocks[r]
        self.service.set_clock(r, clock, samples=self.samples, meet=meet)
        self._tell(clock, meet=meet)
        self.service.wait_meet(meet, self.cfg.timeout_s, what)

    def service_bytes(self) -> dict[str, int]:
        """Bytes the service received and sent (by counter name)."""
        return dict(self.service.bytes)

    # ------------------------------------------------------------------ for other layers
    @property
    def env(self) -> DistEnv:
        """The ranks this engine runs among (this rank's view of the launch)."""
        return self.ctx.env

    @property
    def rpc(self) -> RpcService:
        """This rank's RPC service: other layers register their own operations on it (the
        dense parameter server, work stealing); :attr:`peers` reaches the peers' services."""
        return self.service

    @property
    def peer_samples(self) -> list[int]:
        """The training samples each rank has taken, as this rank's service has seen them."""
        return self.service.samples

    # ------------------------------------------------------------------ the phases
    def _wait(self, target: int, phase: str) -> None:
        t0 = time.perf_counter()
        self.service.wait_clock(target, self.cfg.timeout_s, f"async {phase} (--max-lag)")
        waited = time.perf_counter() - t0
        self.phase_s["clock_wait"] += waited
        self.phase_s["clock_wait_in_step"] += waited  # (inside the loop's step time too)

    def _tick(self, clock: int, tell: bool = True) -> None:
        """Move this rank's clock (and sample count) in its own table; ``tell``: in every
        peer's too, by a clock message (else they learn it from this rank's next message)."""
        self.service.set_clock(self.ctx.env.rank, clock, samples=self.samples)
        if tell:
            self._tell(clock)

    def _tell(self, clock: int, meet: int = 0) -> None:
        """A clock message to every peer: this rank's clock, samples taken and meetings."""
        msg = {"rank": self.ctx.env.rank, "clock": clock, "samples": self.samples, "meet": meet}
        self.peers.publish(wire.CLOCK, msg)

    def _riding(self, evaluating: bool) -> bool:
        """Whether a step's push and clock ride on its reads (see the module docstring)."""
        return self.cfg.max_lag != 0 and not evaluating

    def _push_phase(
        self, grads: tuple[Batch, torch.Tensor] | None, evaluating: bool, send: bool
    ) -> tuple[dict[int, Request], Any]:
        """Stage, apply own rows, push the rest (``send``; else the requests are returned, to
        go with the reads); returns the requests not sent and the deferred-mirror count."""
        self.peers.settle()  # (the last step's acknowledgements, long arrived as a rule)
        reqs, deferred = push_requests(self.ctx, self.lock, self.service, grads, evaluating)
        if not send:
            return reqs, deferred
        # (--max-lag 0, flush, evaluation: applied before this rank's clock moves on)
        self.peers.request_all(reqs, "async push")
        return {}, deferred

    def _flushed(self, prep: Prep, deferred: Any) -> tuple[torch.Tensor, Batch]:
        ctx, z = self.ctx, self.ctx.store.zeros_w[0]
        ctx.counters.set_rows_host(0, 0)
        ctx.counters.rows_dev_step = protocol.deferred_counts(deferred, z)
        ctx.counters.accumulate_rows()
        batch = _batch(prep, ctx.env.rank, ctx.env.world_size)[0]
        return torch.zeros(0, ctx.store.dim, device=ctx.store.device), batch


def _batch(prep: Prep, rank: int, w: int) -> tuple[Batch, list[int]]:
    """The step's :class:`Batch` from the plan's block sizes (read on the host), and its
    mirror count per owner."""
    blocks = prep.blocks.tolist()
    n_own, nqm, nqr = blocks[rank], blocks[w : 2 * w], blocks[2 * w : 3 * w]
    k = n_own + sum(nqm) + sum(nqr)
    batch = Batch(
        u=prep.u[:k], cnt=prep.cnt[:k], slot=prep.slot[:k], inv=prep.inv, n_own=n_own,
        n_mir=sum(nqm), nqr=nqr, nqr_dev=None,
    )  # fmt: skip
    return batch, nqm
