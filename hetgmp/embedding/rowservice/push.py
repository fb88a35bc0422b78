"""The push phase of an asynchronous step (:mod:`.step`): the last step's gradient
staged on the mirrors (write rule), the owned rows' part handed to the service (applied with
the pushes at its next drain), and the push requests per owner: the rows not stored here and
the due mirrors. The rules are :mod:`hetgmp.embedding.protocol`'s; the owner's side is
:meth:`.service.RowService._push`."""

from __future__ import annotations

from typing import Any

import torch

from hetgmp.comm.rpc.peers import Request
from hetgmp.embedding import protocol
from hetgmp.embedding.batch import Batch
from hetgmp.embedding.context import StepContext
from hetgmp.embedding.rowservice import wire
from hetgmp.embedding.rowservice.lock import TableLock
from hetgmp.embedding.rowservice.service import RowService


def push_requests(
    ctx: StepContext, lock: TableLock, service: RowService,
    grads: tuple[Batch, torch.Tensor] | None, evaluating: bool,
) -> tuple[dict[int, Request], torch.Tensor]:  # fmt: skip
    """Stage ``grads`` (the last step's batch and its rows' gradient), stash the owned rows'
    part with ``service``, and build one push per owner (``evaluating``: every pending mirror
    is due, as at flush); returns the requests and the deferred-mirror count. Bytes and pushes
    are counted here, whoever sends them."""
    store, w = ctx.store, ctx.env.world_size
    with lock:
        if grads is not None and grads[0].n_mir:
            pb, pg = grads
            m0, m1 = pb.n_own, pb.n_own + pb.n_mir
            protocol.stage_mirror_updates(store, ctx.opt, pb.slot[m0:m1], pg[m0:m1], pb.cnt[m0:m1])
        due, deferred = _take_due(ctx, evaluating)
        if grads is not None and grads[0].n_own:
            pb, pg = grads
            service.stash_own((pb.slot[: pb.n_own], pb.cnt[: pb.n_own], pg[: pb.n_own]))
    rest: list[Any] = [None] * w  # (rows not stored here, by owner)
    if grads is not None:
        pb, pg = grads
        r0 = pb.n_own + pb.n_mir
        rest = list(zip(*(x[r0:].split(pb.nqr) for x in (pb.u, pb.cnt, pg)), strict=True))
    reqs: dict[int, Request] = {}
    for p in range(w):  # (a cat only where both kinds go to one owner: each is a kernel)
        parts = [q for q in (rest[p], due[p] if due else None) if q and q[0].numel()]
        if parts:
            if len(parts) == 1:
                ids, cnt, grad = parts[0]
            else:
                ids, cnt, grad = (torch.cat(x) for x in zip(*parts, strict=True))
            reqs[p] = (wire.PUSH, {}, {"ids": ids, "cnt": cnt, "grad": grad.float().contiguous()})
    sent = sum(wire.nbytes(q[2]) for q in reqs.values())
    n_p = sum(q[2]["ids"].numel() for q in reqs.values())
    ctx.counters.count_bytes(
        sent={"ids": 8 * n_p, "versions": 8 * n_p, "gradients": sent - 16 * n_p},
        recv={}, reset=True,
    )  # fmt: skip
    ctx.counters.count_pushes(n_p)
    return reqs, deferred


def _take_due(ctx: StepContext, evaluating: bool) -> tuple[list[Any] | None, torch.Tensor]:
    """(Under the lock) the due mirrors' pushes by owner, ``(ids, counts, gradients)`` each
    (None: the table has no mirrors, nothing to look at), and the deferred count."""
    store = ctx.store
    due, per_owner, deferred = protocol.due_state(store, ctx.bound, push_all=evaluating)
    if due is None:
        return None, deferred
    taken = protocol.take_due(store, ctx.opt, torch.nonzero(due).view(-1))
    nd = per_owner.tolist()
    return list(zip(*(x.split(nd) for x in taken), strict=True)), deferred
