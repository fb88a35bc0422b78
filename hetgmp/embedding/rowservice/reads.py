"""The read phase of an asynchronous step (:mod:`.step`): one read request per owner,
stale mirrors refreshed, the batch's rows gathered in block order, counters and audit record.
The rules are :mod:`hetgmp.embedding.protocol`'s; the owner's side is
:meth:`.service.RowService._read`."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from hetgmp.comm.rpc.peers import Peers, Request
from hetgmp.embedding import protocol
from hetgmp.embedding.batch import Batch
from hetgmp.embedding.context import StepContext
from hetgmp.embedding.kernels import take_rows
from hetgmp.embedding.reads import Answers, finish_read
from hetgmp.embedding.rowservice import wire
from hetgmp.embedding.rowservice.lock import TableLock


@dataclasses.dataclass
class SentReads:
    """Read requests sent and not yet answered (:func:`send_reads` -> :func:`receive_reads`)."""

    batch: Batch
    nqm: list[int]
    bound: int
    peers: list[int]
    sent: dict[str, int]  # bytes sent by kind (counted with the answers)


def send_reads(
    ctx: StepContext, lock: TableLock, peers: Peers, planned: tuple[Batch, list[int]],
    bound: int, pushes: dict[int, Request] | None = None, tick: dict[str, Any] | None = None,
) -> SentReads:  # fmt: skip
    """Send one read per owner with queries: the batch's mirror ids with their versions and
    the rows not stored here. Their answers are for :func:`receive_reads` (or
    :func:`drop_reads`), before any other request on ``peers``.

    With ``tick`` (the sender's clock, :meth:`.step.AsyncStep._begin`'s one message per
    owner and step): each read also carries the clock and the push to its owner (``pushes``,
    applied by the owner before it answers: the answer acknowledges it too); a push to an owner
    with nothing to read goes alone with the clock (its acknowledgement owed), and a peer that
    gets neither gets the clock alone."""
    store, batch, nqm = ctx.store, planned[0], planned[1]
    n_o, n_m = batch.n_own, batch.n_own + batch.n_mir
    with lock:
        mver = store.version.index_select(0, batch.slot[n_o:n_m])
    mids, rids = batch.u[n_o:n_m].split(nqm), batch.u[n_m:].split(batch.nqr)
    mv = mver.split(nqm)
    meta: dict[str, Any] = {"bound": bound, "send_all": bool(ctx.send_all), **(tick or {})}
    alone = dict(pushes or {})
    reqs = {}
    for p in range(ctx.env.world_size):
        if nqm[p] + batch.nqr[p]:
            arrays = {"mids": mids[p], "mver": mv[p], "rids": rids[p]}
            if p in alone:
                arrays.update(alone.pop(p)[2])
            reqs[p] = (wire.READ, meta, arrays)
    peers.send(reqs)
    if tick is not None:
        peers.send_acked({p: (op, {**m, **tick}, a) for p, (op, m, a) in alone.items()},
                         "async push")  # fmt: skip
        peers.publish(wire.CLOCK, tick, skip=set(reqs) | set(alone))
    n_ids = sum(q[2]["mids"].numel() + q[2]["rids"].numel() for q in reqs.values())
    return SentReads(batch, nqm, bound, list(reqs), {"ids": 8 * n_ids, "versions": 8 * batch.n_mir})


def drop_reads(ctx: StepContext, peers: Peers, sent: SentReads) -> None:
    """Take and discard the answers of reads sent and no longer needed (bytes counted)."""
    _collect(ctx, peers, sent)


def receive_reads(
    ctx: StepContext, lock: TableLock, peers: Peers, sent: SentReads, deferred: torch.Tensor
) -> torch.Tensor:
    """The answers of :func:`send_reads`: stale mirrors refreshed, the batch's unique rows'
    values in block order, counters and audit record."""
    batch, nqm, bound = sent.batch, sent.nqm, sent.bound
    replies = _collect(ctx, peers, sent)
    if not batch.n_mir and not ctx.audit:
        return _rows_only(ctx, lock, batch, replies, deferred)
    a = _assemble(ctx, replies, nqm, batch.nqr)
    ctx.counters.set_rows_host(batch.n_own, sum(batch.nqr))
    return finish_read(ctx, batch, a, bound, deferred, lock)


def _rows_only(
    ctx: StepContext, lock: TableLock, batch: Batch, replies: dict[int, dict[str, Any]],
    deferred: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """:func:`receive_reads` of a batch without mirrors (no partition, or none of its rows
    mirrored here): the answers are the rows not stored here, copied into place; no lags to
    look at (a dozen small device ops fewer a step)."""
    store, n_o = ctx.store, batch.n_own
    values = torch.empty(batch.u.numel(), store.dim, device=store.device)
    with lock:
        take_rows(store.weight, batch.slot[:n_o], out=values[:n_o], backend=ctx.kernels)
    off = n_o
    for p, n in enumerate(batch.nqr):
        if n:
            values[off : off + n] = replies[p]["values"]
            off += n
    z = store.zeros_w[0]
    ctx.counters.set_rows_host(n_o, off - n_o)
    ctx.counters.rows_dev_step = protocol.deferred_counts(deferred, z)
    ctx.counters.accumulate_rows()
    return values


def _collect(ctx: StepContext, peers: Peers, sent: SentReads) -> dict[int, dict[str, Any]]:
    """The answers of ``sent``; counts the bytes both ways."""
    st, d, qr = ctx.opt.state_width > 0, ctx.store.dim, sent.batch.nqr
    replies = peers.collect(
        sent.peers, "async read",
        lambda p: wire.read_reply(sent.nqm[p], qr[p], d, st, sent.bound, bool(ctx.send_all)),
    )  # fmt: skip
    recv = {"versions": 0, "values": 0}
    for a in replies.values():
        recv["versions"] += wire.nbytes({k: a[k] for k in ("lag", "versions")})
        recv["values"] += wire.nbytes({k: a[k] for k in ("values", "state") if k in a})
    ctx.counters.count_bytes(sent=sent.sent, recv=recv, reset=False)
    return replies


def _assemble(
    ctx: StepContext, replies: dict[int, dict[str, Any]], nqm: list[int], nqr: list[int]
) -> Answers:
    """The owners' answers in block order: lags; values, versions, state of the refreshed
    mirrors (``mir_*``) and of the rows not stored here (``rem_*``)."""
    store, sw, w = ctx.store, ctx.opt.state_width, ctx.env.world_size
    d, dev = store.dim, store.device
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("lag", "mv", "rv", "mver", "rver")}
    parts.update(ms=[], rs=[])
    for p in range(w):
        a = replies.get(p)
        if a is None:
            continue
        k_m = a["values"].shape[0] - nqr[p]  # mirrors the owner sent a value for
        parts["lag"].append(a["lag"])
        for key, src in (("mv", "values"), ("mver", "versions"), ("ms", "state")):
            if src in a:
                parts[key].append(a[src][:k_m])
                parts["r" + key[1:]].append(a[src][k_m:])
    empty_i = torch.zeros(0, dtype=torch.int64, device=dev)

    def cat(key: str, like: torch.Tensor) -> torch.Tensor:
        return torch.cat(parts[key]) if parts[key] else like

    empty_v = torch.zeros(0, d, device=dev)
    state = torch.zeros(0, device=dev)
    return Answers(
        cat("lag", empty_i), cat("mv", empty_v), cat("mver", empty_i),
        cat("ms", state) if sw else None, cat("rv", empty_v),
        rem_ver=cat("rver", empty_i), rem_state=cat("rs", state) if sw else None,
    )  # fmt: skip
