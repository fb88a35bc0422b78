"""Diagnosis only: parts of the multi-GPU step left out, to learn what the step's time waits
for (``switches.py ablate:NAME``). A run with an ablation trains WRONG values: its speed is a
diagnosis, never a figure, and its AUC means nothing.

Why: on 2 H100s (2026-11-27, ``bench/results/gpu/chain_switches/``) cutting pieces of the
exchange's chain after backward (13, 9, 6 us of a kernel timeline) and the dense all-reduce's
42 us (summed in peer memory instead) each left the step where it was, so the timeline's
critical path is not the step's; leaving whole parts out says which parts the step pays for.

* ``exchange``: the padded exchange's step (pack, both payload exchanges, the owner's update,
  answers, finish) not run at all;
* ``replies``: its second half not run (no answers' barrier, no finish);
* ``sum``: the rows' gradient not summed (the buffer stays as it is);
* ``dense_ar``: the dense gradients not summed over ranks;
* ``presync``: the last batch's gradient part of the pre-sync segment (own rows staged,
  mirrors' local step, pushes' gradients) not run;
* ``due``: no mirror is ever due (the due scan, count and list not run, nothing pushed for
  want of freshness), i.e. the passes over every mirror each step gone;
* ``plan``: the next batch's plan not made once its ring slot holds one (the slot keeps an
  older batch's plan: valid indices, wrong rows), i.e. the five plan kernels that run beside
  the forward gone;
* ``replica``: every rank holds the WHOLE table and takes the one-rank step on it (no plan, no
  exchange, no mirrors; the ranks' tables drift apart), the dense gradients still summed over
  ranks in the one-rank whole-step graph: the ceiling of a 2-GPU step whose embedding work is
  one GPU's (the lean local step, ``docs/scaling_plan.md`` session 22);
* ``beside_rows`` (exact; only with ``replica*``, read_ahead_ab.sh's ``besiderows``): that
  graph's dense sum started before its row update and waited for after it;
* ``replica_sync`` / ``_ahead`` / ``_peer`` / ``_peerahead`` / ``_peer1`` / ``_flag``:
  ``replica`` plus a lean step's least row traffic each step, by NCCL, over peer memory with a
  barrier per half or one, or a step late behind a one-way flag; in the step's tail or beside
  the forward (``replica_traffic.py``).
"""

from __future__ import annotations

from typing import Any


def _no_exchange(st: Any, segment: Any) -> None:
    # (the own rows' update forked beside the chain, owner_update.OWN_SPLIT, is still joined:
    # a capture refuses a stream left unjoined)
    from hetgmp.embedding.padded import owner_update

    owner_update.join_own(st)


def _no_replies() -> None:
    # (the step as it is, less finish and the answers' barrier of the peer-memory payloads,
    # the default; the all-to-alls' second exchange, where they run, stays)
    from hetgmp.embedding.padded import buffers, peer_payloads

    step, exchange = buffers.StaticExchange._step, peer_payloads.PeerPayloads.exchange

    def without(st: Any, segment: Any) -> None:
        step(st, lambda key, fn: None if key == "finish" else segment(key, fn))

    def first_only(peer: Any, send: Any, name: str, rider: Any = None) -> None:
        if name != "recv2":
            exchange(peer, send, name, rider)

    buffers.StaticExchange._step = without  # type: ignore[method-assign]
    peer_payloads.PeerPayloads.exchange = first_only  # type: ignore[method-assign]


def _no_due() -> None:
    from hetgmp.embedding.padded import kernels

    kernels.DUE_FROM_SCAN = False  # (the table reads ndue, which the counts phase zeroed)
    kernels.count_due = lambda st: None

    def listed_empty(st: Any, *, listed: bool = False, scanned: bool = False) -> None:
        st.deferred.zero_()
        st.due_listed = True  # (pack then walks the empty per-owner lists)

    kernels.due_prefix = listed_empty


def _no_plan() -> None:
    from hetgmp.embedding.padded import graphs

    fill = graphs.PrepRing.fill

    def stale(ring: Any, ids: Any) -> Any:
        s = ring.next_slot
        out = ring._out[s]
        if ring.fixed and out is not None:
            return out, s, True
        return fill(ring, ids)

    graphs.PrepRing.fill = stale  # type: ignore[method-assign]


def _replica() -> None:
    import numpy as np

    from hetgmp.embedding import engines, module

    def everything_here(plan: Any, num_rows: int, env: Any, *rest: Any) -> Any:
        return np.full(num_rows, env.rank, dtype=np.int32), np.zeros(0, np.int64)

    module.placement_of = everything_here  # type: ignore[assignment]
    module.make_engine = lambda ctx, anchor, **kw: engines.LocalEngine(ctx, anchor)  # type: ignore[assignment]


def _beside_rows() -> None:
    import torch.distributed as dist

    from hetgmp.embedding.engines import LocalEngine
    from hetgmp.train import dense_sync

    buckets: list[Any] = []
    init, apply_pending = dense_sync.GradBucket.__init__, LocalEngine.apply_pending

    def remember(bucket: Any, *args: Any, **kw: Any) -> None:
        init(bucket, *args, **kw)
        buckets.append(bucket)

    def started_first(engine: Any) -> None:
        for b in buckets:  # (GradBucket.all_reduce waits for a sum started from offset 0)
            if b.peer is None and b._early is None and b.env.world_size > 1 and b.flat.numel():
                b._early = (0, dist.all_reduce(b.flat, group=b.env.group, async_op=True))
        apply_pending(engine)

    dense_sync.GradBucket.__init__ = remember  # type: ignore[method-assign]
    LocalEngine.apply_pending = started_first  # type: ignore[method-assign]


# replica_* -> (transport, beside the forward): replica_traffic.py
REPLICA_TRAFFIC = {
    "replica_sync": ("nccl", False), "replica_ahead": ("nccl", True),
    "replica_peer": ("peer", False), "replica_peerahead": ("peer", True),
    "replica_peer1": ("peer1", False), "replica_flag": ("flag", False),
}  # fmt: skip


def apply(name: str) -> None:
    """Leave part ``name`` out of every step from now on (see the module docstring)."""
    from hetgmp.embedding.padded import buffers, kernels
    from hetgmp.train import dense_sync

    if name == "exchange":
        buffers.StaticExchange._step = _no_exchange  # type: ignore[method-assign]
    elif name == "replies":
        _no_replies()
    elif name == "sum":
        buffers.StaticExchange.sum_grad = (  # type: ignore[method-assign]
            lambda st, inv, g, rows=None, *, slot, fields=None, zero=True: (
                st.grad_of(slot) if rows is None else st.grad_of(slot)[:rows]
            )
        )
    elif name == "dense_ar":
        dense_sync.GradBucket.all_reduce = lambda self: None  # type: ignore[method-assign]
    elif name == "presync":
        kernels.presync_values = lambda st, prev: None
    elif name == "plan":
        _no_plan()
    elif name == "due":
        _no_due()
    elif name == "replica":
        _replica()
    elif name == "beside_rows":
        _beside_rows()
    elif name in REPLICA_TRAFFIC:  # (replica_traffic.py)
        import replica_traffic

        _replica()
        replica_traffic.install(*REPLICA_TRAFFIC[name])
    else:
        raise SystemExit(f"ablations: no ablation {name!r}")
