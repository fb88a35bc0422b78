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
  the forward gone.
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


def _replica_flag() -> None:
    import os

    import torch

    from hetgmp.comm.peer_memory import PeerMemory
    from hetgmp.embedding import local

    _replica()
    k1, k2 = (
        int(os.environ.get(k, d)) for k, d in (("ABL_PUSH_ROWS", 1100), ("ABL_REPLY_ROWS", 800))
    )
    orig = local.LocalStep._apply
    made: dict[str, Any] = {}

    def buffers(step: Any) -> Any:  # (made in the warm-up steps, before any capture)
        if "pm" not in made:
            env, w = step.ctx.env, step.weight
            n, d, g = w.shape[0], w.shape[1], torch.Generator().manual_seed(1)
            made["idx"] = [
                torch.randint(0, n, (k,), generator=g).to(w.device) for k in (k1, k1, k2, k2)
            ]
            lay = {
                "push": ((k1, d), w.dtype),
                "reply": ((k2, d), w.dtype),
                "flag": ((1,), torch.int64),
            }
            made["pm"] = PeerMemory(env, lay)
            made["seq"] = torch.zeros(1, dtype=torch.int64, device=w.device)
        return made

    def apply(step: Any, pb: Any, pg: Any) -> None:
        if pb.lead is None or not torch.cuda.is_available():
            return orig(step, pb, pg)
        import flag_triton

        w, env = step.weight, step.ctx.env
        b = buffers(step)
        (src, dst, rsrc, rdst), pm, seq = b["idx"], b["pm"], b["seq"]
        other = (env.rank + 1) % env.world_size
        flag_triton.wait(pm.mine("flag"), seq)  # (the last step's rows: set a step ago)
        w.index_add_(0, dst, pm.mine("push"), alpha=-0.01)
        w.index_copy_(0, rdst, pm.mine("reply"))
        orig(step, pb, pg)
        seq.add_(1)
        torch.index_select(w, 0, src, out=pm.peer("push", other))
        torch.index_select(w, 0, rsrc, out=pm.peer("reply", other))
        flag_triton.signal(pm.peer("flag", other), seq)
        return None

    local.LocalStep._apply = apply  # type: ignore[method-assign]


def _replica_traffic(ahead: bool, peer: bool, one_phase: bool = False) -> None:
    """``replica`` plus a lean step's least traffic (``replica_sync`` / ``_ahead`` /
    ``_peer`` / ``_peerahead``: module docstring)."""
    import os

    import torch
    import torch.distributed as dist

    from hetgmp.comm.peer_memory import PeerMemory
    from hetgmp.embedding import local

    _replica()
    k1, k2 = (
        int(os.environ.get(k, d)) for k, d in (("ABL_PUSH_ROWS", 1100), ("ABL_REPLY_ROWS", 800))
    )
    made: dict[str, Any] = {}

    def buffers(step: Any) -> Any:  # (made in the warm-up steps, before any capture)
        if "idx" not in made:
            env, w = step.ctx.env, step.weight
            n, ws, g = w.shape[0], env.world_size, torch.Generator().manual_seed(1)
            made["idx"] = [
                torch.randint(0, n, (k * ws,), generator=g).to(w.device) for k in (k1, k1, k2, k2)
            ]
            made["recv"] = (w.new_empty(k1 * ws, w.shape[1]), w.new_empty(k2 * ws, w.shape[1]))
            if peer:
                lay = {"push": ((k1, w.shape[1]), w.dtype), "reply": ((k2, w.shape[1]), w.dtype)}
                made["pm"] = PeerMemory(env, lay)
        return made

    def by_nccl(step: Any) -> None:
        w, grp = step.weight, step.ctx.env.group
        (src, dst, rsrc, rdst), (recv, rrecv) = buffers(step)["idx"], made["recv"]
        dist.all_to_all_single(recv, w.index_select(0, src), group=grp)
        w.index_add_(0, dst, recv, alpha=-0.01)
        dist.all_to_all_single(rrecv, w.index_select(0, rsrc), group=grp)
        w.index_copy_(0, rdst, rrecv)

    def by_peer(step: Any) -> None:  # (the rows written straight into the peer's buffers)
        w, env = step.weight, step.ctx.env
        (src, dst, rsrc, rdst), pm = buffers(step)["idx"], made["pm"]
        other = (env.rank + 1) % env.world_size
        torch.index_select(w, 0, src[:k1], out=pm.peer("push", other))
        pm.barrier()
        w.index_add_(0, dst[:k1], pm.mine("push"), alpha=-0.01)
        torch.index_select(w, 0, rsrc[:k2], out=pm.peer("reply", other))
        pm.barrier()
        w.index_copy_(0, rdst[:k2], pm.mine("reply"))

    def by_peer1(step: Any) -> None:  # (both halves in one phase, one barrier; a step's
        # writes may race the peer's reads of the last step's: a diagnosis, not a transport)
        w, env = step.weight, step.ctx.env
        (src, dst, rsrc, rdst), pm = buffers(step)["idx"], made["pm"]
        other = (env.rank + 1) % env.world_size
        torch.index_select(w, 0, src[:k1], out=pm.peer("push", other))
        torch.index_select(w, 0, rsrc[:k2], out=pm.peer("reply", other))
        pm.barrier()
        w.index_add_(0, dst[:k1], pm.mine("push"), alpha=-0.01)
        w.index_copy_(0, rdst[:k2], pm.mine("reply"))

    traffic = (by_peer1 if one_phase else by_peer) if peer else by_nccl
    orig_apply, orig_step = local.LocalStep._apply, local.LocalStep.step

    def apply_after(step: Any, pb: Any, pg: Any) -> None:  # (waited for in the step)
        orig_apply(step, pb, pg)
        if pb.lead is not None:
            traffic(step)

    def step_ahead(step: Any, ids: Any, **kw: Any) -> Any:  # (beside the forward)
        if ids.numel() and torch.cuda.is_available():
            side = made.setdefault("side", torch.cuda.Stream())
            buffers(step)  # (not on the side stream)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                traffic(step)
            made["open"] = True
        return orig_step(step, ids, **kw)

    def apply_joined(step: Any, pb: Any, pg: Any) -> None:
        if made.pop("open", False):
            torch.cuda.current_stream().wait_stream(made["side"])
        orig_apply(step, pb, pg)

    if ahead:
        local.LocalStep.step = step_ahead  # type: ignore[method-assign]
        local.LocalStep._apply = apply_joined  # type: ignore[method-assign]
    else:
        local.LocalStep._apply = apply_after  # type: ignore[method-assign]


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
    elif name == "replica_flag":
        _replica_flag()
    elif name.startswith("replica_"):
        kind = name.removeprefix("replica_")
        if kind not in ("sync", "ahead", "peer", "peerahead", "peer1"):
            raise SystemExit(f"ablations: no ablation {name!r}")
        _replica_traffic(
            ahead=kind.endswith("ahead"), peer=kind.startswith("peer"), one_phase=kind == "peer1"
        )
    else:
        raise SystemExit(f"ablations: no ablation {name!r}")
