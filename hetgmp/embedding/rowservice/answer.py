"""The row service's arithmetic (``--sync async``), compiled with TorchScript so that it runs
without the GIL: the owner's update of its rows (:func:`apply_updates`), the read answer
(:func:`read_answer`) and the slots of pushed rows (:func:`push_slots`).

Why TorchScript: the service thread shares the interpreter with the training thread. Every
torch call made from Python drops the GIL for its C++ work and must take it back, so two
threads that both make torch calls alternate at every call, each hand-over a thread wake-up
(a GIL convoy, ``bench/async_convoy.py``). An answer written as Python made ~100 torch calls,
and the training thread of a GPU rank makes one per kernel launch. A scripted function runs
its whole body in C++ with the GIL released: an answer now takes the GIL a handful of times
(socket frames, header, one call, reply). Ids are checked and looked up on the host (no wait
for the device); a read answer waits for the device once, for its copy back. On 2 H200s this
and the host-side checks made async 1.37x faster (``bench/results/async_ab_2gpu.md``).

TorchScript is deprecated in torch 2.x (a ``DeprecationWarning`` when a function is scripted,
silenced here) but ships and works; should a torch drop it, these three functions become one
C++ op (``torch.library``) with the same signatures. Each one has a plain reference that tests
compare it with: :func:`hetgmp.embedding.protocol.apply_at_owner` (with the ``torch`` row
kernels), :func:`~hetgmp.embedding.protocol.lags` and the service's Python read before this
module (``tests/test_async_answer.py``).

Error codes (the service raises the message): :data:`OK`, :data:`OUTSIDE` (an id outside the
table), :data:`NOT_OWNED` (a row the service's rank does not own).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch import Tensor

from hetgmp.embedding import protocol

OK, OUTSIDE, NOT_OWNED = 0, 1, 2
MESSAGES = {
    OUTSIDE: "a request names a row id outside the table",
    NOT_OWNED: "a request names a row this rank does not own",
}


def _owned(own_slot: Tensor, ids: Tensor, num_rows: int) -> tuple[Tensor, int]:
    """Slots of owned rows ``ids`` and an error code, on the host (no wait for the device).
    One table lookup: ``own_slot`` is ``[num_rows + 2]`` int32 on the host, entry ``1 + id``
    the slot of an owned row, -1 for any other row and at both ends (ids outside the table
    fall on the ends)."""
    slots = own_slot.index_select(0, ids.clamp(-1, num_rows) + 1).long()
    code = 0
    if ids.numel() > 0:
        if int(slots.min()) < 0:
            code = 1 if bool(((ids < 0) | (ids >= num_rows)).any()) else 2
    return slots, code


def _to(t: Tensor, device: torch.device) -> Tensor:
    """A host array on ``device``: on CUDA through pinned memory, copied without waiting (the
    pinned block is not reused before the copy ran: torch's host allocator records it)."""
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _read_answer(
    own_slot: Tensor, num_rows: int, weight: Tensor, version: Tensor, opt_state: Tensor,
    with_state: bool, mids: Tensor, mver: Tensor, rids: Tensor, bound: int, send_all: bool,
) -> tuple[int, list[Tensor]]:  # fmt: skip
    """``(code, [lag, values, versions(, state)])`` on the host: every mirror query's lag
    (owner version minus the requester's ``mver``), then value, version (and optimizer state)
    of the mirrors beyond ``bound`` (all of them with ``send_all``) and of every row ``rids``.
    The request (``mids``, ``mver``, ``rids``) is on the host, the table on its device; the
    one wait for the device is the answer's copy back. An error code gives no arrays."""
    m_host, c1 = _owned(own_slot, mids, num_rows)
    r_host, c2 = _owned(own_slot, rids, num_rows)
    if c1 != 0 or c2 != 0:
        return max(c1, c2), []
    dev = weight.device
    m_slot = _to(m_host, dev)
    lag = version.index_select(0, m_slot) - _to(mver, dev)
    sent = m_slot if send_all else m_slot[protocol.beyond_bound(lag, bound)]
    rows = torch.cat([sent, _to(r_host, dev)])
    out = [lag, weight.index_select(0, rows), version.index_select(0, rows)]
    if with_state:
        out.append(opt_state.index_select(0, rows))
    return 0, [t.cpu() for t in out]


def _push_slots(
    own_slot: Tensor, num_rows: int, ids: Tensor, cnt: Tensor, grad: Tensor, dim: int,
    device: torch.device,
) -> tuple[int, Tensor, Tensor, Tensor]:  # fmt: skip
    """``(code, slots, counts, grad [n, dim])`` of a push received on the host, on
    ``device`` (the table's)."""
    slots, code = _owned(own_slot, ids, num_rows)
    if code != 0:
        return code, slots, cnt, grad
    g = grad.reshape(slots.numel(), dim)
    return 0, _to(slots, device), _to(cnt, device), _to(g, device)


def _adagrad_step(
    weight: Tensor, state: Tensor, slots: Tensor, grad: Tensor, lr: float, eps: float
) -> None:
    """Row-wise Adagrad on distinct rows (``adagrad_rows_reference``)."""
    s = state.index_select(0, slots) + grad.pow(2).mean(dim=1)
    state.index_copy_(0, slots, s)
    weight.index_add_(0, slots, grad * (lr / (s.sqrt() + eps)).unsqueeze(1), alpha=-1.0)


def _apply_updates(
    weight: Tensor, version: Tensor, state: Tensor, scratch: Tensor, o_slot: Tensor,
    o_cnt: Tensor, o_grad: Tensor, p_slots: list[Tensor], p_cnts: list[Tensor],
    p_grads: list[Tensor], sgd: bool, lr: float, eps: float,
) -> None:  # fmt: skip
    """:func:`hetgmp.embedding.protocol.apply_at_owner` for ``torch`` row kernels: the
    owner's own rows ``(o_slot, o_cnt, o_grad)`` (distinct) and the pushes (lists, rows may
    repeat and overlap the own rows) in one optimizer update per row; versions move by the
    occurrences. ``scratch``: ``[n_own]`` int64 (a per-slot position map, Adagrad)."""
    pushed = len(p_slots) > 0
    if sgd or not pushed:  # (SGD is linear: each contribution added equals their sum)
        if o_slot.numel() > 0:
            if sgd:
                weight.index_add_(0, o_slot, o_grad, alpha=-lr)
            else:
                _adagrad_step(weight, state, o_slot, o_grad, lr, eps)
            version.index_add_(0, o_slot, o_cnt)
        for i in range(len(p_slots)):
            if p_slots[i].numel() > 0:
                weight.index_add_(0, p_slots[i], p_grads[i], alpha=-lr)
                version.index_add_(0, p_slots[i], p_cnts[i])
        return
    p_slot, p_cnt, p_grad = torch.cat(p_slots), torch.cat(p_cnts), torch.cat(p_grads)
    m0, p = o_slot.numel(), p_slot.numel()
    if m0 + p == 0:
        return
    # every distinct row gets a "leader" entry (own rows win, then one push per row), the
    # gradients are summed into the leaders, every entry applies its leader's sums
    ar = torch.arange(m0 + p, device=weight.device)
    scratch.index_copy_(0, p_slot, ar[m0:])
    scratch.index_copy_(0, o_slot, ar[:m0])
    lead = torch.cat([ar[:m0], scratch.index_select(0, p_slot)])
    slots = torch.cat([o_slot, p_slot])
    gsum = torch.zeros(m0 + p, weight.shape[1], device=weight.device)
    gsum.index_add_(0, lead, torch.cat([o_grad, p_grad]))
    csum = torch.zeros(m0 + p, dtype=torch.int64, device=weight.device)
    csum.index_add_(0, lead, torch.cat([o_cnt, p_cnt]))
    is_lead = lead == ar
    g = gsum.index_select(0, lead)
    s = state.index_select(0, slots) + g.pow(2).mean(dim=1)
    state.index_copy_(0, slots, s)  # (repeats write identical values)
    step = g * (lr / (s.sqrt() + eps) * is_lead).unsqueeze(1)
    weight.index_add_(0, slots, step, alpha=-1.0)
    version.index_add_(0, slots, csum.index_select(0, lead) * is_lead)


def _script(fn: Any) -> Any:
    """``fn`` scripted, called without the graph executor's optimizations. Why: the profiling
    executor re-profiles and, on CUDA, compiles fused kernels for new input shapes, and every
    request has other sizes (each compile costs milliseconds; on 2 H200s the drain took ~2 ms
    a step). The plain interpreter runs the same ops in C++ (the flag is per thread)."""
    with warnings.catch_warnings():  # (deprecated, see the module docstring)
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(fn)

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        with torch.jit.optimized_execution(False):
            return scripted(*args)

    return call


read_answer = _script(_read_answer)
push_slots = _script(_push_slots)
apply_updates = _script(_apply_updates)
