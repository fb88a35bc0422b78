"""The distributed embedding table: owned + mirrored rows per worker, bounded-staleness sync.

Storage per worker (all on ``env.device``):

* ``weight [S, D]`` float32, ``version [S]`` int64 and the optimizer state of the ``S = n_own +
  n_mir`` stored rows: slots ``[0, n_own)`` are the rows this worker owns, ``[n_own, S)`` its
  mirrors. For an owned row ``version`` counts the sample-level updates applied (one per
  occurrence of the id in a batch); for a mirror it is the owner version its value reflects.
* mirrors also keep ``pending`` (local updates not yet pushed), ``grad_acc`` (their raw summed
  gradient, what is pushed) and ``delta_acc`` (what was applied locally, re-added on refresh).
* id -> slot map: a dense global ``slot_of [num_rows]`` int32 table (-1 = not stored) plus
  ``owner_of [num_rows]`` int32. 8 bytes per global row: 270 MB for Criteo's 33.8M rows, small
  next to the rows themselves, and a lookup is one gather (no search, no hashing).

One ``forward`` is one training step (see DESIGN.md, "The staleness protocol"):

1. stage the previous step's gradients (write rule): owned rows are kept to be applied with the
   pushes; mirrors apply them locally and push their accumulated gradient once
   ``pending > bound``; rows not stored are pushed every step;
2. exchange 1 (sizes, then payload): queries (id + mirror version, -1 if not stored) and pushes
   (id + count + gradient) go to the owners;
3. owners apply own + pushed gradients (one optimizer update per row per step, the sum of all
   contributions, which makes bound 0 equal the single-process reference), then answer: every
   query gets the owner version, and rows not stored or mirrored beyond the bound also get the
   value (+ optimizer state); exchange 2 (sizes, then payload) carries the replies back;
4. stale mirrors are refreshed (owner value + own unpushed delta) and the batch's rows gathered.

The sizes table also carries each rank's status and operation, so a rank with bad input makes
its peers fail at once with :class:`PeerFailedError` instead of waiting for a timeout.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch import nn

from hetgmp.comm.env import DistEnv
from hetgmp.comm.errors import PeerFailedError
from hetgmp.comm.exchange import exchange_counts, exchange_payload, pack_i64, unpack_i64
from hetgmp.embedding.counters import ROW_KINDS, zero_counters
from hetgmp.embedding.errors import EmbeddingInputError, StalenessViolation
from hetgmp.embedding.init import initial_rows
from hetgmp.embedding.ops import index_add_rows
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.placement import owner_array, plan_placement
from hetgmp.embedding.profile import PhaseTimer
from hetgmp.embedding.reference import check_ids
from hetgmp.partition.plan import Plan

# Columns of the per-step sizes table (one row per peer).
_NQ, _NP, _STATUS, _BOUND, _SEND_ALL, _OP = range(6)
_OP_FORWARD, _OP_FLUSH = 1, 2
_OP_NAMES = {_OP_FORWARD: "forward", _OP_FLUSH: "flush"}
_ROW_COUNTERS = (*(f"rows_{k}" for k in ROW_KINDS), "rows_mirror_refreshed", "pushes_deferred")


@dataclasses.dataclass
class _Writes:
    """Gradients staged for this step's exchange."""

    own_slots: torch.Tensor
    own_cnt: torch.Tensor
    own_grad: torch.Tensor
    push_ids: torch.Tensor
    push_cnt: torch.Tensor
    push_grad: torch.Tensor
    deferred: torch.Tensor  # scalar: mirror rows holding updates the bound lets them keep


class DistributedEmbedding(nn.Module):
    """An embedding table spread over the ranks of ``env`` (see the module docstring).

    ``plan`` (if given) decides owners and mirror priorities; otherwise ``placement`` (``hash``:
    ``id % world``; ``random``) decides owners and there are no mirrors. ``store_rate`` is the
    share of all rows each worker mirrors (top of its plan priority list). ``bound`` is the
    staleness bound in owner-applied sample-level updates (0 = bulk-synchronous). ``audit``
    makes owners return values for every query and records/checks every read's lag
    (``last_audit``); it costs bandwidth and is meant for tests.
    """

    def __init__(
        self,
        num_rows: int,
        dim: int,
        env: DistEnv,
        plan: Plan | None = None,
        *,
        placement: str = "hash",
        store_rate: float = 0.0,
        bound: int = 0,
        optimizer: str = "sgd",
        lr: float = 0.01,
        init_scale: float = 0.01,
        seed: int = 0,
        adagrad_eps: float = 1e-10,
        adagrad_init: float = 0.0,
        audit: bool = False,
    ) -> None:
        super().__init__()
        if num_rows < 1 or dim < 1:
            raise ValueError(f"num_rows and dim must be >= 1, got {num_rows} and {dim}")
        if bound < 0:
            raise ValueError(f"bound must be >= 0, got {bound}")
        if not 0.0 <= store_rate <= 1.0:
            raise ValueError(f"store_rate must be in [0, 1], got {store_rate}")
        self.num_rows, self.dim, self.bound = int(num_rows), int(dim), int(bound)
        self.env, self.device, self.audit = env, env.device, audit
        self.opt = SparseOptimizer(optimizer, lr, adagrad_eps, adagrad_init)
        w, r = env.world_size, env.rank
        if plan is not None:
            owner, mirrors = plan_placement(plan, self.num_rows, w, r, store_rate)
        else:
            if store_rate > 0:
                raise ValueError("store_rate > 0 needs a plan (it ranks the rows to mirror)")
            owner, mirrors = owner_array(self.num_rows, w, placement, seed), np.zeros(0, np.int64)
        owned = np.flatnonzero(owner == r)
        self.n_own, self.n_mir = int(owned.size), int(mirrors.size)
        slot_of = np.full(self.num_rows, -1, dtype=np.int32)
        slot_of[owned] = np.arange(self.n_own, dtype=np.int32)
        slot_of[mirrors] = self.n_own + np.arange(self.n_mir, dtype=np.int32)
        dev = self.device
        self.owner_of = torch.from_numpy(owner).to(dev)
        self.slot_of = torch.from_numpy(slot_of).to(dev)
        self.stored_ids = torch.from_numpy(np.concatenate([owned, mirrors]).astype(np.int64)).to(
            dev
        )
        self.weight = initial_rows(self.stored_ids, self.dim, seed=seed, scale=init_scale)
        self.version = torch.zeros(self.n_own + self.n_mir, dtype=torch.int64, device=dev)
        self.opt_state = self.opt.new_state(self.n_own + self.n_mir, dev)
        self.pending = torch.zeros(self.n_mir, dtype=torch.int64, device=dev)
        self.grad_acc = torch.zeros(self.n_mir, self.dim, device=dev)
        self.delta_acc = torch.zeros(self.n_mir, self.dim, device=dev)
        self._grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._bytes_total = zero_counters()
        self._bytes_step = zero_counters()
        self._rows_total = torch.zeros(len(_ROW_COUNTERS), dtype=torch.int64, device=dev)
        self._rows_step = torch.zeros_like(self._rows_total)
        self.last_audit: dict[str, torch.Tensor] | None = None
        self.timer = PhaseTimer(dev, enabled=False)  # bench/ turns it on: timer.enabled = True

    # ------------------------------------------------------------------ public API
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up ``ids [B, F]`` (int64) -> ``[B, F, D]``; one call is one training step."""
        err = check_ids(ids, self.num_rows)
        ids = (
            ids.to(self.device)
            if err is None
            else torch.zeros(0, 1, dtype=torch.int64, device=self.device)
        )
        b, f = ids.shape
        self.timer.start()
        uniq, inv, cnt = torch.unique(ids.reshape(-1), return_inverse=True, return_counts=True)
        values = self._step(uniq, op=_OP_FORWARD, error=err)
        if self.training and torch.is_grad_enabled():
            leaf = values.requires_grad_()

            def capture(g: torch.Tensor) -> None:
                self._grads = (uniq, cnt, g.detach())

            leaf.register_hook(capture)
            values = leaf
        return values[inv].view(b, f, self.dim)

    def flush(self) -> None:
        """(Collective) push every pending gradient and mirror delta so owners hold final values."""
        self._step(torch.zeros(0, dtype=torch.int64, device=self.device), op=_OP_FLUSH, error=None)

    def counters(self) -> dict[str, int]:
        """Cumulative counters (bytes by kind, rows by source, pushes)."""
        return self._merge(self._bytes_total, self._rows_total)

    def step_counters(self) -> dict[str, int]:
        """The last step's counters."""
        return self._merge(self._bytes_step, self._rows_step)

    def state_dict(  # type: ignore[override]
        self,
        *args: Any,
        destination: dict[str, Any] | None = None,
        prefix: str = "",
        keep_vars: bool = False,
    ) -> dict[str, Any]:
        """(Collective: flushes first) ``{"ids", "weight", "opt_state"}`` of the rows this rank owns."""
        self.flush()
        sd = {
            "ids": self.stored_ids[: self.n_own].cpu().clone(),
            "weight": self.weight[: self.n_own].cpu().clone(),
            "opt_state": self.opt_state[: self.n_own].cpu().clone(),
        }
        if destination is None:
            return sd
        destination.update({prefix + k: v for k, v in sd.items()})
        return destination

    def load_state_dict(
        self, sd: dict[str, torch.Tensor], strict: bool = True, assign: bool = False
    ) -> Any:  # type: ignore[override]
        """Load rows by global id from the union of any ranks' state dicts (any world size / plan).

        Every stored row (owned and mirrored) takes its saved value; versions restart at 0 on all
        ranks, so mirrors start in sync. Pending gradients are dropped."""
        ids = torch.as_tensor(sd["ids"]).to(torch.int64).reshape(-1)
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.num_rows):
            raise ValueError(f"state dict holds row ids outside [0, {self.num_rows})")
        order = torch.argsort(ids)
        sorted_ids = ids[order]
        want = self.stored_ids.cpu()
        pos = torch.searchsorted(sorted_ids, want).clamp(max=max(ids.numel() - 1, 0))
        found = (
            (sorted_ids[pos] == want) if ids.numel() else torch.zeros_like(want, dtype=torch.bool)
        )
        if not bool(found.all()):
            missing = want[~found]
            raise ValueError(
                f"state dict lacks {missing.numel()} of the {want.numel()} rows rank {self.env.rank} "
                f"stores (first missing id {int(missing[0])}); pass the union of all ranks' dicts"
            )
        src = order[pos]
        weight = torch.as_tensor(sd["weight"])
        if weight.shape != (ids.numel(), self.dim):
            raise ValueError(
                f"state dict weight has shape {tuple(weight.shape)}, expected ({ids.numel()}, {self.dim})"
            )
        self.weight.copy_(weight[src].to(self.device))
        if self.opt.state_width:
            self.opt_state.copy_(torch.as_tensor(sd["opt_state"])[src].to(self.device))
        self.version.zero_()
        self.pending.zero_()
        self.grad_acc.zero_()
        self.delta_acc.zero_()
        self._grads = None
        return None

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # Called when a parent module loads a state dict containing this table.
        keys = ("ids", "weight", "opt_state")
        if all(prefix + k in state_dict for k in keys):
            self.load_state_dict({k: state_dict[prefix + k] for k in keys})

    def extra_repr(self) -> str:
        return (
            f"num_rows={self.num_rows}, dim={self.dim}, rank={self.env.rank}/{self.env.world_size}, "
            f"owned={self.n_own}, mirrors={self.n_mir}, bound={self.bound}, optimizer={self.opt.name}"
        )

    # ------------------------------------------------------------------ one step
    def _merge(self, byte_counts: dict[str, int], rows: torch.Tensor) -> dict[str, int]:
        out = dict(byte_counts)
        for k, v in zip(_ROW_COUNTERS, rows.tolist(), strict=True):
            out[k] = int(v)
        out["rows_requested"] = sum(out[f"rows_{k}"] for k in ROW_KINDS)
        return out

    def _stage_writes(self, push_all: bool) -> _Writes:
        """Apply the write rule to the last captured gradients (see the module docstring)."""
        dev, d = self.device, self.dim
        e_i = torch.zeros(0, dtype=torch.int64, device=dev)
        e_g = torch.zeros(0, d, device=dev)
        own_slots, own_cnt, own_grad, rem_ids, rem_cnt, rem_grad = e_i, e_i, e_g, e_i, e_i, e_g
        if self._grads is not None:
            uniq, cnt, grad = self._grads
            self._grads = None
            slot = self.slot_of[uniq].long()
            is_own = (slot >= 0) & (slot < self.n_own)
            is_mir = slot >= self.n_own
            is_rem = slot < 0
            own_slots, own_cnt, own_grad = slot[is_own], cnt[is_own], grad[is_own]
            rem_ids, rem_cnt, rem_grad = uniq[is_rem], cnt[is_rem], grad[is_rem]
            ms = slot[is_mir]
            mi = ms - self.n_own
            gm = grad[is_mir]
            state = self.opt_state.index_select(0, ms) if self.opt.state_width else self.opt_state
            delta, state = self.opt.local_step(state, gm)
            if self.opt.state_width:
                self.opt_state.index_copy_(0, ms, state)
            index_add_rows(self.weight, ms, delta)
            index_add_rows(self.delta_acc, mi, delta)
            index_add_rows(self.grad_acc, mi, gm)
            index_add_rows(self.pending, mi, cnt[is_mir])
        threshold = 0 if push_all else self.bound
        due = torch.nonzero(self.pending > threshold).squeeze(1)
        ms = due + self.n_own
        push_ids = torch.cat([rem_ids, self.stored_ids[ms]])
        push_cnt = torch.cat([rem_cnt, self.pending[due]])
        push_grad = torch.cat([rem_grad, self.grad_acc[due]])
        if self.opt.exact_mirror:
            # The mirror's value already holds exactly what the owner is about to apply.
            index_add_rows(self.version, ms, self.pending[due])
        self.pending[due] = 0
        self.grad_acc[due] = 0.0
        self.delta_acc[due] = 0.0
        deferred = (self.pending > 0).sum()
        return _Writes(own_slots, own_cnt, own_grad, push_ids, push_cnt, push_grad, deferred)

    def _check_peers(self, table: torch.Tensor, op: int) -> None:
        bad = torch.nonzero(table[:, _STATUS] != 0).squeeze(1).tolist()
        if bad:
            raise PeerFailedError(
                f"rank {self.env.rank}: rank(s) {bad} reported bad input to the embedding "
                f"lookup; aborting this step (see their error)"
            )
        ops = table[:, _OP].tolist()
        if any(o != op for o in ops):
            names = {i: _OP_NAMES.get(o, str(o)) for i, o in enumerate(ops)}
            raise PeerFailedError(
                f"rank {self.env.rank}: ranks disagree on the collective call ({names}); every "
                f"rank must call forward (an empty batch when it has none left) or flush together"
            )

    def _step(self, uniq: torch.Tensor, *, op: int, error: str | None) -> torch.Tensor:
        env, dev, d, w = self.env, self.device, self.dim, self.env.world_size
        sw = self.opt.state_width
        evaluating = op == _OP_FLUSH or not self.training
        bound = 0 if evaluating else self.bound
        self.timer.mark("unique")
        writes = self._stage_writes(push_all=evaluating)
        self.timer.mark("update")
        is_own = self.owner_of[uniq] == env.rank
        nonown_pos = torch.nonzero(~is_own).squeeze(1)
        q_ids = uniq[nonown_pos]
        q_dest = self.owner_of[q_ids].long()
        order = torch.argsort(q_dest, stable=True)
        q_ids, q_dest, q_pos = q_ids[order], q_dest[order], nonown_pos[order]
        q_slot = self.slot_of[q_ids].long()
        is_mirror = q_slot >= self.n_own
        q_mv = torch.where(
            is_mirror, self.version[q_slot.clamp(min=0)], torch.full_like(q_slot, -1)
        )
        p_dest = self.owner_of[writes.push_ids].long()
        porder = torch.argsort(p_dest, stable=True)
        p_ids, p_cnt, p_grad = (
            writes.push_ids[porder],
            writes.push_cnt[porder],
            writes.push_grad[porder],
        )

        # ---- sizes exchange 1 (also carries status, bound, audit flag and operation)
        table = torch.zeros(w, 6, dtype=torch.int64, device=dev)
        table[:, _NQ] = torch.bincount(q_dest, minlength=w)
        table[:, _NP] = torch.bincount(p_dest, minlength=w)
        table[:, _STATUS] = 1 if error else 0
        table[:, _BOUND] = bound
        table[:, _SEND_ALL] = int(self.audit)
        table[:, _OP] = op
        self.timer.mark("unique")
        mine = table.cpu()
        theirs = exchange_counts(env, table, "embedding size exchange 1")
        if error:
            raise EmbeddingInputError(f"rank {env.rank}: {error}")
        self._check_peers(theirs, op)
        nq, np_ = mine[:, _NQ].tolist(), mine[:, _NP].tolist()
        nq_in, np_in = theirs[:, _NQ].tolist(), theirs[:, _NP].tolist()

        # ---- payload exchange 1: queries (id, mirror version) + pushes (id, count, gradient)
        packed = (
            pack_i64(q_ids),
            pack_i64(q_mv),
            pack_i64(p_ids),
            pack_i64(p_cnt),
            p_grad.reshape(-1),
        )
        send = _interleave(packed, [(nq, 2), (nq, 2), (np_, 2), (np_, 2), (np_, d)], w)
        recv = exchange_payload(
            env,
            send,
            [4 * a + (4 + d) * b for a, b in zip(nq, np_, strict=True)],
            [4 * a + (4 + d) * b for a, b in zip(nq_in, np_in, strict=True)],
            "embedding exchange 1",
        )
        r_qids, r_qmv, r_pids, r_pcnt, r_pgrad = _split(
            recv, [(nq_in, 2), (nq_in, 2), (np_in, 2), (np_in, 2), (np_in, d)], w
        )
        r_qids, r_qmv, r_pids, r_pcnt = (unpack_i64(x) for x in (r_qids, r_qmv, r_pids, r_pcnt))
        r_pgrad = r_pgrad.view(-1, d)
        self.timer.mark("exchange")

        # ---- owners apply own + pushed gradients: one optimizer update per row per step
        self._apply_owned(writes, r_pids, r_pcnt, r_pgrad)
        self.timer.mark("update")
        self._count_bytes(
            sent={
                "ids": 8 * (q_ids.numel() + p_ids.numel()),
                "versions": 8 * (q_ids.numel() + p_ids.numel()),
                "gradients": 4 * d * p_ids.numel(),
            },
            recv={
                "ids": 8 * (r_qids.numel() + r_pids.numel()),
                "versions": 8 * (r_qids.numel() + r_pids.numel()),
                "gradients": 4 * d * r_pids.numel(),
            },
            reset=True,
        )
        self._bytes_step["pushes_sent"] = p_ids.numel()
        self._bytes_total["pushes_sent"] += p_ids.numel()
        if op == _OP_FLUSH:
            self._rows_step.zero_()
            self._rows_step[-1] = writes.deferred
            self._rows_total += self._rows_step
            return torch.zeros(0, d, device=dev)

        # ---- owners answer: version for every query, value (+state) when needed
        src = torch.repeat_interleave(torch.arange(w, device=dev), torch.tensor(nq_in, device=dev))
        r_slot = self.slot_of[r_qids].long()
        ov = self.version[r_slot]
        need = (
            (r_qmv < 0)
            | (ov - r_qmv > theirs[:, _BOUND].to(dev)[src])
            | (theirs[:, _SEND_ALL].to(dev)[src] > 0)
        )
        vals = self.weight[r_slot[need]]
        if sw:
            vals = torch.cat([vals, self.opt_state[r_slot[need]][:, None]], dim=1)
        k_out = torch.bincount(src[need], minlength=w)
        self.timer.mark("gather")
        k_in = exchange_counts(env, k_out[:, None], "embedding size exchange 2")[:, 0].tolist()
        k_out_l = k_out.tolist()
        send2 = _interleave((pack_i64(ov), vals.reshape(-1)), [(nq_in, 2), (k_out_l, d + sw)], w)
        recv2 = exchange_payload(
            env,
            send2,
            [2 * a + (d + sw) * k for a, k in zip(nq_in, k_out_l, strict=True)],
            [2 * a + (d + sw) * k for a, k in zip(nq, k_in, strict=True)],
            "embedding exchange 2",
        )
        q_ov, q_vals = _split(recv2, [(nq, 2), (k_in, d + sw)], w)
        q_ov, q_vals = unpack_i64(q_ov), q_vals.view(-1, d + sw)
        self.timer.mark("exchange")
        self._count_bytes(
            sent={"versions": 8 * r_qids.numel(), "values": 4 * (d + sw) * sum(k_out_l)},
            recv={"versions": 8 * q_ids.numel(), "values": 4 * (d + sw) * sum(k_in)},
            reset=False,
        )
        values = self._gather(
            uniq, is_own, q_pos, q_slot, is_mirror, q_mv, q_ov, q_vals, bound, writes.deferred
        )
        self.timer.mark("gather")
        return values

    def _apply_owned(
        self, writes: _Writes, r_pids: torch.Tensor, r_pcnt: torch.Tensor, r_pgrad: torch.Tensor
    ) -> None:
        slots = torch.cat([writes.own_slots, self.slot_of[r_pids].long()])
        if slots.numel() == 0:
            return
        cnt = torch.cat([writes.own_cnt, r_pcnt])
        grad = torch.cat([writes.own_grad, r_pgrad])
        uslots, inv = torch.unique(slots, return_inverse=True)
        gsum = torch.zeros(uslots.numel(), self.dim, device=self.device).index_add_(0, inv, grad)
        csum = torch.zeros(uslots.numel(), dtype=torch.int64, device=self.device).index_add_(
            0, inv, cnt
        )
        self.opt.apply(self.weight, self.opt_state, uslots, gsum)
        index_add_rows(self.version, uslots, csum)

    def _gather(
        self,
        uniq: torch.Tensor,
        is_own: torch.Tensor,
        q_pos: torch.Tensor,
        q_slot: torch.Tensor,
        is_mirror: torch.Tensor,
        q_mv: torch.Tensor,
        q_ov: torch.Tensor,
        q_vals: torch.Tensor,
        bound: int,
        deferred: torch.Tensor,
    ) -> torch.Tensor:
        d = self.dim
        lag = q_ov - q_mv
        refresh = is_mirror & (lag > bound)
        stale = ~is_mirror | refresh  # the rows whose values the owner sent (all, in audit mode)
        vals_stale = q_vals[stale] if self.audit else q_vals
        rs = q_slot[refresh]
        v_ref = vals_stale[refresh[stale]]
        if rs.numel():
            # Owner's value plus this mirror's own updates the owner has not seen yet.
            self.weight[rs] = v_ref[:, :d] + self.delta_acc[rs - self.n_own]
            self.version[rs] = q_ov[refresh]
            if self.opt.state_width:
                self.opt_state[rs] = v_ref[:, d]
        values = torch.empty(uniq.numel(), d, device=self.device)
        own_pos = torch.nonzero(is_own).squeeze(1)
        values[own_pos] = self.weight[self.slot_of[uniq[own_pos]].long()]
        values[q_pos[is_mirror]] = self.weight[q_slot[is_mirror]]
        values[q_pos[~is_mirror]] = vals_stale[~is_mirror[stale]][:, :d]
        fresh = is_mirror & (lag == 0)
        stale_ok = is_mirror & (lag > 0) & (lag <= bound)
        self._rows_step = torch.stack(
            [
                is_own.sum(),
                fresh.sum(),
                stale_ok.sum(),
                (~is_mirror).sum() + refresh.sum(),
                refresh.sum(),
                deferred,
            ]
        )
        self._rows_total += self._rows_step
        if self.audit:
            used = is_mirror & ~refresh
            if bool((is_mirror & (lag < 0)).any()) or bool((used & (lag > bound)).any()):
                raise StalenessViolation(
                    f"rank {self.env.rank}: a mirror read lags its owner by "
                    f"{int(lag[is_mirror].max())} (min {int(lag[is_mirror].min())}) with bound {bound}"
                )
            mi = (q_slot - self.n_own).clamp(min=0)
            self.last_audit = {
                "ids": uniq[q_pos].clone(),
                "is_mirror": is_mirror.clone(),
                "refreshed": refresh.clone(),
                "lag": torch.where(is_mirror & ~refresh, lag, torch.zeros_like(lag)),
                "owner_version": q_ov.clone(),
                "owner_value": q_vals[:, :d].clone(),
                "used_value": values[q_pos].clone(),
                "pending": torch.where(
                    is_mirror, self.pending[mi] if self.n_mir else lag * 0, torch.zeros_like(lag)
                ),
            }
        return values

    def _count_bytes(self, *, sent: dict[str, int], recv: dict[str, int], reset: bool) -> None:
        if reset:
            self._bytes_step = {k: 0 for k in self._bytes_step}
            self._bytes_step["steps"] = 1
            self._bytes_total["steps"] += 1
        for prefix, part in (("bytes_sent_", sent), ("bytes_recv_", recv)):
            for k, v in part.items():
                self._bytes_step[prefix + k] += v
                self._bytes_total[prefix + k] += v


def _interleave(
    parts: tuple[torch.Tensor, ...], layout: list[tuple[list[int], int]], w: int
) -> torch.Tensor:
    """Flat send buffer: for each peer j, the j-th segment of every part in order.

    ``layout[p] = (rows per peer, floats per row)`` of part ``p``. Loops over peers, not rows."""
    offsets = [0] * len(parts)
    pieces = []
    for j in range(w):
        for p, (rows, width) in enumerate(layout):
            n = rows[j] * width
            pieces.append(parts[p][offsets[p] : offsets[p] + n])
            offsets[p] += n
    return torch.cat(pieces) if pieces else parts[0].new_zeros(0)


def _split(buf: torch.Tensor, layout: list[tuple[list[int], int]], w: int) -> list[torch.Tensor]:
    """Inverse of :func:`_interleave`: one flat tensor per part, peers concatenated in order."""
    per_part: list[list[torch.Tensor]] = [[] for _ in layout]
    off = 0
    for j in range(w):
        for p, (rows, width) in enumerate(layout):
            n = rows[j] * width
            per_part[p].append(buf[off : off + n])
            off += n
    return [torch.cat(x) for x in per_part]
