"""The row service of ``--sync async``: this rank's RPC service (:mod:`hetgmp.comm.rpc`) with
the operations on the rows it owns registered, and the rank's table of its peers' clocks
(stale synchronous parallel, see :mod:`.step`).

Three operations (:mod:`.wire`):

* **read** ``(mids, mver, rids)`` + the requester's ``bound`` and ``send_all``: the lag of every
  mirror query (``owner version - mirror version``, :func:`protocol.lags`) and value, version
  (and optimizer state) of the mirrors beyond the bound (every mirror with ``send_all``, as in
  audit mode) and of every row not stored there, all read under the table lock at one moment;
* **push** ``(ids, cnt, grad)``: buffered (under the lock) and acknowledged; the buffer, with
  the owner's own rows' gradient of its step (:meth:`RowService.stash_own`), is applied with
  the owner's sparse optimizer in one :func:`protocol.apply_at_owner` call right before the
  next read of this rank's rows (:meth:`RowService.drain`: a peer's read, or the owner's own
  read phase), so a worker that has its acks knows its update is visible to every later read,
  and a row gets one optimizer step for all the pushes of a step (row-wise Adagrad then
  equals the collective path at ``--bound 0 --max-lag 0``);
* **clock** ``(rank, clock, samples, meet)``: a peer's progress (no answer): its clock, the
  training samples it has taken so far (the budget stop rule of :mod:`hetgmp.train.async_loop`)
  and the last meeting it arrived at; under ``--max-lag`` != 0 a training step's clock rides
  on its read, with the push to this owner in the same message (:meth:`RowService._step`:
  push, then clock, then the answer).

Each operation is registered with its schema (:func:`.wire.schemas`): the service checks
every request against it before a handler runs (ids in the table, at most ``n_own`` rows an
array, counts per id, finite gradients, a clock only from another rank), and refuses and
counts a bad one (:mod:`hetgmp.comm.rpc.schema`); the handlers check only what needs the
table (that this rank owns the rows).

Other layers register their own operations on the same service (the dense parameter shards of
:mod:`hetgmp.train.dense_server`, work stealing's claims); they are answered by their handler.

The lock (:class:`~.lock.TableLock`) is shared with the training thread, which takes it for its
own use of the table (owned rows, mirror staging, reads). On CUDA the table stays on the
device: the thread runs on a CUDA stream of its own (the lock orders it with the training
thread's). Requests are read on the host, where their ids are checked and looked up (no wait
for the device); what the table needs goes to the device through pinned memory, and a read is
gathered there and copied back for the reply (into pageable memory, one blocking copy per
array: the answer's one wait for the device; one pinned copy is a next step). The arithmetic
is scripted (:mod:`.answer`): an answer runs without the GIL.
"""

from __future__ import annotations

from typing import Any

import torch

from hetgmp.comm.errors import CommError
from hetgmp.comm.rpc.security import CurveKeys
from hetgmp.comm.rpc.service import MAX_FRAME_BYTES, RpcService
from hetgmp.embedding.context import StepContext
from hetgmp.embedding.rowservice import answer, wire
from hetgmp.embedding.rowservice.lock import TableLock


class RowService(RpcService):
    """The service of one rank with the row operations registered: bound on ``host:port``
    (0: a port the OS picks) at construction, serving from :meth:`start` until
    :meth:`close`."""

    title = "the async row service"
    peer_left = "closed its table"
    bind_hint = "; pick another --async-host / --async-port-base"

    def __init__(
        self, ctx: StepContext, lock: TableLock, host: str, port: int, keys: CurveKeys | None
    ) -> None:
        store = ctx.store
        # (a push of every owned row is its largest frame)
        frame = max(MAX_FRAME_BYTES, 4 * store.n_own * max(store.dim, 1) + 4096)
        super().__init__(ctx.env.rank, ctx.env.world_size, host, port, store.device, keys, frame)
        self.ctx, self.lock = ctx, lock
        self.own_slot = _own_slots(ctx.store)
        w = ctx.env.world_size
        self.clocks = [0] * w
        self.samples = [0] * w  # training samples each rank has taken (clock messages)
        self.meets = [0] * w  # the meetings each rank has arrived at (AsyncStep.meet)
        self.bytes = {f"bytes_{d}_{k}": 0 for d in ("sent", "recv") for k in wire.KINDS}
        # pushes accepted but not yet applied, and the owner's own rows' gradient (drain())
        self.buffered: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.own: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        ops = wire.schemas(store.num_rows, store.n_own, store.dim, self.peer_field)
        self.register(wire.READ, self._on_read, ops[wire.READ])
        self.register(wire.PUSH, self._on_push, ops[wire.PUSH])
        self.register(wire.CLOCK, self._on_clock, ops[wire.CLOCK])

    # ------------------------------------------------------------------ clocks
    def set_clock(self, rank: int, clock: int, samples: int = 0, meet: int = 0) -> None:
        """Raise what this rank knows of ``rank``'s clock, samples taken and meetings."""
        with self.cv:
            self.clocks[rank] = max(self.clocks[rank], clock)
            self.samples[rank] = max(self.samples[rank], samples)
            self.meets[rank] = max(self.meets[rank], meet)
            self.cv.notify_all()

    def wait_clock(
        self, target: int, timeout_s: float, what: str, budget: int | None = None
    ) -> bool:
        """Block until every rank's clock is at least ``target``; a clear error after
        ``timeout_s`` naming the slowest rank. With ``budget``: stop waiting as soon as the
        ranks' samples add up to it, and return False then (True: the clocks are there)."""
        with self.cv:

            def behind() -> list[int]:
                return [r for r, c in enumerate(self.clocks) if c < target]

            def spent() -> bool:
                return budget is not None and sum(self.samples) >= budget

            ok = self.cv.wait_for(
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
        with self.cv:

            def absent() -> list[int]:
                return [r for r, m in enumerate(self.meets) if m < meet]

            ok = self.cv.wait_for(
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

    # ------------------------------------------------------------------ the operations
    def _on_read(self, meta: dict[str, Any], a: dict[str, torch.Tensor]) -> dict[str, Any]:
        """A read (with the sender's push and clock, if it carries them): the answer."""
        self._count("recv", a)
        if "clock" in meta:
            self._step(meta, a)
        out = self._read(meta, a)
        self._count("sent", out)
        return out  # (host arrays: read_answer copies them)

    def _on_push(self, meta: dict[str, Any], a: dict[str, torch.Tensor]) -> dict[str, Any]:
        """A push (with the sender's clock, if it carries it): a bare acknowledgement."""
        self._count("recv", a)
        if "clock" in meta:
            self._step(meta, a)
        else:
            self._push(a)
        return {}

    def _on_clock(self, meta: dict[str, Any], a: dict[str, torch.Tensor]) -> None:
        self.set_clock(
            int(meta["rank"]), int(meta["clock"]), int(meta.get("samples", 0)),
            int(meta.get("meet", 0)),
        )  # fmt: skip

    def _read(self, meta: dict[str, Any], a: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Drain, then one scripted call (no GIL: :mod:`.answer`) that checks the ids,
        computes the lags and gathers the answer on the host."""
        store = self.ctx.store  # (the request fits wire.schemas: checked by the service)
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
        store = self.ctx.store  # (ids, counts, finite gradients: checked by wire.schemas)
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
            kind = wire.KIND_OF[name]
            self.bytes[f"bytes_{direction}_{kind}"] += t.numel() * t.element_size()


def _own_slots(store: Any) -> torch.Tensor:
    """``[num_rows + 2]`` int32 on the host: entry ``1 + id`` is the slot of a row this rank
    owns, -1 for any other row and at both ends (the ids below 0 and above the table)."""
    own = store.slot_of.cpu().clone()
    own[(own < 0) | (own >= store.n_own)] = -1
    edge = torch.full((1,), -1, dtype=own.dtype, device=own.device)
    return torch.cat([edge, own, edge])
