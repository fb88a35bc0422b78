"""The pre-sync part of a padded step (:meth:`.buffers.StaticExchange.presync`), and its
counts phase run early.

A step's pre-sync part has two phases (with the fused kernels). The **counts** phase: the last
batch's counts (its own rows' versions, its mirrors' pending counts, its pushes' ids and
counts), the next batch's inputs and sizes table, then the sizes exchange; it reads no gradient
value. The **gradient** phase: the last batch's gradient summed per row, its own rows staged or
updated, its mirrors' local step, its pushes' gradients.

Why the counts phase may run early: in the whole-step graph the next batch's exchange starts
right after this batch's backward (:mod:`.ahead`, exchanging early), and everything it runs
before the gradient sum finishes waits for it. The counts phase needs only this batch's plan and
the next one's, known once the next batch is planned (during this batch's forward): run there,
on the plan's side stream, it leaves the exchange's critical path (~35 us of a 0.88 ms step at
batch 8192 on 2 H100s: 3 kernels, the sizes all-to-all and its gaps). Nothing between the two
phases reads what the counts phase writes (own versions, mirror pending counts, the push and
next-batch inputs): the model's forward and backward touch no table state.
"""

from __future__ import annotations

from typing import Any

import torch

from hetgmp.embedding import sizes
from hetgmp.embedding.ops import current_stream
from hetgmp.embedding.padded import kernels as fused_segments
from hetgmp.embedding.padded import owner_update
from hetgmp.embedding.padded import reference as torch_segments

# The due mirrors listed with the early counts phase, so that pack copies those only
# (.due_triton; False: pack scans every mirror on the exchange's chain, as before).
DUE_LIST = True

# (``st`` below: a :class:`~.buffers.StaticExchange`, which imports this module)


def presync(
    st: Any, prev: Any, cur: Any, bound_cols: torch.Tensor,
    grad_occ: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    """The part of a step before the sizes exchange, for the batch after this one's (``prev``:
    the batch ``st`` ran, ``grad_occ`` its gradient, one row per occurrence; ``cur``: the next
    batch, preprocessed): ``prev``'s gradient summed per row into ``st.grad``, SGD on its own
    rows, its mirrors' local step, the push inputs, the next batch's inputs and sizes table
    (into ``st.sz_mine``); then the sizes exchange. Returns both tables on the CPU (``[2, w,
    COLS]``: sent, received), the step's one wait for the device. Graphs per ring slot of
    ``cur`` (see :class:`.graphs.PrepRing`) once both are at fixed addresses. ``bound_cols``:
    ``[w, 4]`` the bound / audit / operation / padded columns. With the fused kernels the sizes
    table needs counts only, so the gradient's part runs after the exchange, while the host
    reads the sizes and launches the rest (and its counts phase may have run already:
    :func:`counts_early`). ``grad_occ`` None: ``st.grad`` holds the sum already (the
    whole-step graph's form); while ``st.capturing`` nothing waits for the device (the tables
    returned are then a replay's to read, :mod:`.whole`)."""
    # (shapes with one numel share a graph; what reads the gradient: a graph per address of
    # the incoming gradient, a training loop's allocator hands out one or two)
    capturable = prev.static and cur.static
    ready = None if st.capturing else st._sizes_ready
    counted, st.counted = st.counted, None
    if counted is None:  # (no early counts phase: this step's replay counters not added,
        st.replay_counted = st.pushes_early = st.own_split = False  # (nor the pushes' ids)
    # (and a graph per form of the gradient's part: with owner_update.OWN_SPLIT it updates the
    # own rows no push joins, a host decision a replayed segment would not make again)
    key_g = (*_key(prev, cur), "summed" if grad_occ is None else grad_occ.data_ptr(), st.own_split)
    if counted is not None and counted != (prev.ring, cur.ring):
        raise RuntimeError(
            f"the counts phase ran early for ring slots {counted}, not {prev.ring, cur.ring}"
        )
    st.bind(prev.ring, cur.ring)

    def summed() -> None:
        if grad_occ is not None:
            st.sum_grad(prev.inv, grad_occ, slot=prev.ring, fields=prev.fields)

    if counted is None:
        if st.fused:
            _counts_phase(st, prev, cur, bound_cols)
        else:  # (the reference: all of it before the exchange)
            fn = lambda: _reference_before(st, prev, cur, bound_cols, summed)  # noqa: E731
            st._segment(key_g, fn, capturable=capturable)
            if not st.comm_in_graphs:
                st.sizes_exchange()
    if ready is not None:
        ready.record(current_stream(st.store.device))
    if st.fused:

        def after() -> None:
            summed()
            fused_segments.presync_values(st, prev)
            _mark_staged(st)

        st._segment(key_g, after, capturable=capturable)
    if ready is not None:
        ready.synchronize()
    return st.host_sizes


def counts_early(st: Any, prev: Any, cur: Any, bound_cols: torch.Tensor) -> None:
    """The counts phase of the coming :func:`presync` of ``(prev, cur)`` (and the sizes
    exchange) now; that call then runs the gradient phase only (module docstring). Fused
    kernels only; the call must follow before any other presync of ``st``."""
    assert st.fused and st.counted is None, st.counted
    st.bind(prev.ring, cur.ring)
    # (captured: its replay counters from the table now, off the exchange's chain, by the
    # table's kernel itself)
    _counts_phase(st, prev, cur, bound_cols, count=st.capturing)
    st.replay_counted = st.capturing
    # (pack's prelude: pending counts and the due pushes per owner are final here)
    fused_segments.due_prefix(st, listed=DUE_LIST, scanned=True)  # (count_due's scan)
    owner_update.pushes_early(st)  # (owner_update.PUSH_SLOTS_EARLY: the pushes' ids now)
    st.due_ready = True
    st.counted = (prev.ring, cur.ring)
    st.counted_early += 1


def count_replay(st: Any) -> None:
    """A replayed step's owned rows, rows not stored here and pushes, from its sizes table
    (``st.sz_mine``), added on the device (:mod:`.whole`: a replay's host reads nothing)."""
    t = st.sz_mine
    st.ctx.counters.replay_dev[:3].add_(
        torch.stack([t[0, sizes.NOWN], t[:, sizes.NQR].sum(), t[:, sizes.NP].sum()])
    )


def _mark_staged(st: Any) -> None:
    # (train/product_hold.py: the dense product follows this kernel, not the sum, in a capture)
    ctx = st.ctx
    if ctx.mark_staged and st.capturing and st.store.device.type == "cuda":
        ctx.staged = torch.cuda.Event()
        ctx.staged.record(current_stream(st.store.device))


def _key(prev: Any, cur: Any) -> tuple[Any, ...]:
    return ("presync", tuple(cur.ids.shape), prev.ring, cur.ring)


def _counts_phase(
    st: Any, prev: Any, cur: Any, bound_cols: torch.Tensor, *, count: bool = False
) -> None:
    def before() -> None:
        fused_segments.presync_counts(st, prev, cur)
        fused_segments.count_due(st)
        fused_segments.presync_table(st, cur, bound_cols, count=count)
        if st.comm_in_graphs:  # the exchange and the copy for the host: graph nodes
            st.sizes_exchange()

    st._segment(_key(prev, cur), before, capturable=prev.static and cur.static)
    if not st.comm_in_graphs:
        st.sizes_exchange()


def _reference_before(st: Any, prev: Any, cur: Any, bound_cols: torch.Tensor, summed: Any) -> None:
    # (st: a StaticExchange, which mypy does not match to the segments' SegmentBuffers here)
    summed()
    torch_segments.presync(st, prev, cur, bound_cols)
    if st.comm_in_graphs:
        st.sizes_exchange()
