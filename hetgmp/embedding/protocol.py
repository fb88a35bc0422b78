"""The staleness protocol (DESIGN.md, "The staleness protocol"): the one place that says what
``bound`` means. Small tensor functions over a :class:`~hetgmp.embedding.store.RowStore`;
every transport calls them (the padded exchange's fused kernels and torch segments implement the
same rules on fixed-size buffers: the torch segments call the rule functions below, the Triton
kernels restate them in ``padded/rule_triton.py``, which tests/test_staleness_rule.py holds to
these).

* **Read rule.** A batch's rows are owned (used as they are), mirrors, or not stored here. An
  owner answers a mirror query with the lag ``owner_version - mirror_version`` (:func:`lags`);
  a mirror whose lag is within ``bound`` (:func:`within_bound`) is used as it is (*fresh* at
  lag 0, *stale but allowed* above), one beyond the bound (:func:`beyond_bound`) is
  *refreshed*: it takes the owner's value plus its own not-yet-pushed delta
  (:func:`refresh_mirrors`). Rows not stored here take the owner's
  value. :func:`read_counts` counts the classes.
* **Write rule.** Owned rows get the update at once. A mirror applies it locally, accumulates
  the raw gradient and the applied delta, and counts the occurrences in ``pending``
  (:func:`stage_mirror_updates`); it becomes *due* for a push once ``pending > bound``
  (:func:`is_due`; any pending at flush and evaluation; :func:`due_state`), and
  :func:`take_due` clears it; a pending mirror not due is *deferred* (:func:`deferred_mask`). Rows not stored here push every step.
* **Owners apply before answering.** The owner applies its own rows' and every pushed
  gradient, one optimizer update per row per step of the sum of all contributions
  (:func:`apply_at_owner`), before it computes the lags of this step's queries; so ``bound = 0``
  equals the single-process reference (:mod:`hetgmp.embedding.reference`, the tests' oracle).
* **Planning one step ahead and exchanging early** (the multi-rank CUDA graph's default,
  :mod:`hetgmp.embedding.padded.ahead`) change no read: the next batch's plan is made during
  this batch's forward and its exchange right after this batch's backward, in the strict
  order's place relative to every update. **Reading one step ahead** (off by default, a diagnosis) answers the next batch's
  queries before the owners apply this step's gradients, so a row stored elsewhere may also
  miss its owner's updates of the step in flight: beyond ``bound``, which is why it is off.
* **What an owner answers.** With ``replies="stale"`` a value only where the lag exceeds the
  requester's bound (:func:`reply_needed`); with ``replies="all"`` (or audit) a value for
  every mirror query, and the requester keeps the fresh ones.
"""

from __future__ import annotations

import torch

from hetgmp.embedding import sizes
from hetgmp.embedding.kernels import scatter_add_rows
from hetgmp.embedding.ops import index_add_rows
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.store import RowStore

I32_MAX = 2**31 - 1  # lags travel as int32
_I64_MIN = -(2**63)


def within_bound(lag: torch.Tensor, bound: int) -> torch.Tensor:
    """Read rule: a mirror read ``lag`` owner updates behind (``owner_version -
    mirror_version``) is used as it is (``lag <= bound``)."""
    return lag <= bound


def beyond_bound(lag: torch.Tensor, bound: int) -> torch.Tensor:
    """Read rule: a mirror read ``lag`` behind is refreshed from its owner (``lag > bound``,
    the complement of :func:`within_bound`). Scriptable: the row service's TorchScript
    answer calls it."""
    return lag > bound


def is_due(pending: torch.Tensor, bound: int) -> torch.Tensor:
    """Write rule: a mirror holding ``pending`` unpushed updates pushes now
    (``pending > bound``)."""
    return pending > bound


def deferred_mask(pending: torch.Tensor, due: torch.Tensor) -> torch.Tensor:
    """Mirrors with updates the bound lets them keep: pending, not due."""
    return (pending > 0) & ~due


def due_state(
    store: RowStore, bound: int, *, push_all: bool
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """``(due mask or None without mirrors, due mirrors per owner [w], deferred)``: the
    mirrors that push now (``pending > bound``; every pending one at flush and evaluation,
    ``push_all``) and how many hold updates the bound lets them keep (a device scalar)."""
    if store.n_mir == 0:
        return None, store.zeros_w, store.zeros_w[0]
    due = is_due(store.pending, 0 if push_all else bound)
    deferred = deferred_mask(store.pending, due).sum()
    return due, store.due_per_owner(due), deferred


def stage_mirror_updates(
    store: RowStore, opt: SparseOptimizer, slots: torch.Tensor, grad: torch.Tensor,
    cnt: torch.Tensor,
) -> None:  # fmt: skip
    """Write rule for a batch's mirrors (``slots``, their summed ``grad`` and occurrence
    ``cnt``): the optimizer's local step on the mirror, the applied delta and the raw gradient
    accumulated, the occurrences added to ``pending``."""
    mi = slots - store.n_own
    sw = opt.state_width
    state = store.opt_state.index_select(0, slots) if sw else store.opt_state
    delta, state = opt.local_step(state, grad)
    if sw:
        store.opt_state.index_copy_(0, slots, state)
    scatter_add_rows(store.weight, slots, delta, backend=opt.kernels)
    index_add_rows(store.delta_acc, mi, delta)
    index_add_rows(store.grad_acc, mi, grad)
    index_add_rows(store.pending, mi, cnt)


def take_due(
    store: RowStore, opt: SparseOptimizer, di: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The due mirrors ``di`` (mirror indices) as pushes ``(ids, counts, gradients)``; their
    sync state is cleared. With an optimizer whose local step equals the owner's (SGD), the
    mirror already holds what the owner is about to apply: its version moves with the push."""
    ids = store.stored_ids.index_select(0, di + store.n_own)
    cnt = store.pending.index_select(0, di)
    grad = store.grad_acc.index_select(0, di)
    if di.numel():
        if opt.exact_mirror:
            index_add_rows(store.version, di + store.n_own, cnt)
        store.pending.index_fill_(0, di, 0)
        store.grad_acc.index_fill_(0, di, 0.0)
        store.delta_acc.index_fill_(0, di, 0.0)
    return ids, cnt, grad


def apply_at_owner(
    store: RowStore, opt: SparseOptimizer, own: tuple[torch.Tensor, ...],
    pushed: tuple[torch.Tensor, ...],
) -> None:  # fmt: skip
    """Owners apply their own rows' ``(slots, counts, grads)`` (unique) and the pushed
    ``(slots, counts, grads)`` (may repeat, may overlap the own rows): one optimizer update per
    row of the summed gradient; versions move by the occurrences."""
    o_slot, o_cnt, o_grad = own
    p_slot, p_cnt, p_grad = pushed
    if opt.name == "sgd" or p_slot.numel() == 0:
        # SGD is linear: adding each contribution equals adding their sum (up to float
        # summation order), so pushed rows need no merging.
        opt.apply(store.weight, store.opt_state, o_slot, o_grad)
        index_add_rows(store.version, o_slot, o_cnt)
        if p_slot.numel():
            opt.apply(store.weight, store.opt_state, p_slot, p_grad)  # SGD: repeats ok
            index_add_rows(store.version, p_slot, p_cnt)
        return
    # Adagrad: give every distinct row a "leader" entry through a per-slot position map (own
    # rows win, then one push per row), sum into the leaders, and apply at every entry with
    # the leader's sums: the duplicates write identical state and add a zero step.
    m0, p, dev = o_slot.numel(), p_slot.numel(), store.device
    pos_map = store.scratch_map()
    ar = torch.arange(m0 + p, device=dev)
    pos_map.index_copy_(0, p_slot, ar[m0:])
    pos_map.index_copy_(0, o_slot, ar[:m0])
    lead = torch.cat([ar[:m0], pos_map[p_slot]])
    slots = torch.cat([o_slot, p_slot])
    gsum = torch.zeros(m0 + p, store.dim, device=dev).index_add_(
        0, lead, torch.cat([o_grad, p_grad])
    )
    csum = torch.zeros(m0 + p, dtype=torch.int64, device=dev).index_add_(
        0, lead, torch.cat([o_cnt, p_cnt])
    )
    is_lead = lead == ar
    opt.apply_merged(store.weight, store.opt_state, slots, gsum[lead], is_lead)
    index_add_rows(store.version, slots, csum[lead] * is_lead)


def lags(store: RowStore, slots: torch.Tensor, versions: torch.Tensor) -> torch.Tensor:
    """Owner side: how many owner updates each queried row (``slots``) is ahead of the
    requester's copy (``versions``)."""
    return store.version.index_select(0, slots) - versions


def reply_needed(lag: torch.Tensor, theirs: torch.Tensor, per_peer: list[int]) -> torch.Tensor:
    """Owner side, ``replies="stale"``: which mirror queries get a value. ``theirs``: the
    received sizes table (each requester's bound and whether it wants every value);
    ``per_peer``: the mirror queries per requester. A requester that wants every value (e.g.
    in audit mode) gets the int64 minimum as its threshold: every lag, even a negative one
    (the violation the audit must see), exceeds it."""
    w = len(per_peer)
    src = torch.repeat_interleave(
        torch.arange(w, device=lag.device), theirs[:, sizes.NQM], output_size=sum(per_peer)
    )
    thr = torch.where(theirs[:, sizes.SEND_ALL] > 0, _I64_MIN, theirs[:, sizes.BOUND])
    return beyond_bound(lag, thr.index_select(0, src))  # type: ignore[arg-type]


def refresh_mirrors(
    store: RowStore, rs: torch.Tensor, owner_vals: torch.Tensor, owner_ver: torch.Tensor,
    owner_state: torch.Tensor | None, refresh: torch.Tensor | None,
) -> None:  # fmt: skip
    """Mirrors ``rs`` (slots) beyond the bound take the owner's value plus their own unpushed
    delta, the owner's version and optimizer state. ``refresh``: None when every row of ``rs``
    is refreshed; else a mask (the owner sent a value for every query, only the stale ones
    take it)."""
    new = owner_vals + store.delta_acc[rs - store.n_own]
    if refresh is not None:
        new = torch.where(refresh[:, None], new, store.weight[rs])
        owner_ver = torch.where(refresh, owner_ver, store.version[rs])
    store.weight.index_copy_(0, rs, new)
    store.version.index_copy_(0, rs, owner_ver)
    if owner_state is not None:
        if refresh is not None:
            owner_state = torch.where(refresh, owner_state, store.opt_state[rs])
        store.opt_state.index_copy_(0, rs, owner_state)


def deferred_counts(deferred: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """:func:`read_counts` of a step that read no mirror: only the deferred count."""
    return torch.stack([zero, zero, zero, deferred.to(torch.int64), zero])


def read_counts(
    q_lag: torch.Tensor, bound: int, refresh: torch.Tensor, deferred: torch.Tensor,
    zero: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """``[fresh, stale-ok, refreshed, deferred, 0]`` of a step's mirror reads (the row-counter
    vector of :class:`~hetgmp.embedding.counters.StepCounters`)."""
    return torch.stack(
        [
            (q_lag == 0).sum(),
            ((q_lag > 0) & within_bound(q_lag, bound)).sum(),
            refresh.sum(),
            deferred.to(torch.int64),
            zero,
        ]
    )
