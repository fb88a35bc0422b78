"""The owner's merged update of the padded exchange, in the fused kernels (:mod:`.owner_triton`):
the own rows' entries and the pushes' made early, in the counts phase, and the own rows no push
joins updated beside the chain (each behind a switch below); :mod:`.kernels` calls it.

Why a module of its own: these are the exchange's chain's levers after backward
(``docs/scaling_plan.md``), which grow with each measured cut; ``st`` below is a
:class:`~.buffers.StaticExchange` (typed ``Any``: it imports the segments).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from hetgmp.embedding import sizes
from hetgmp.embedding.kernels.adagrad import adagrad_rows
from hetgmp.embedding.kernels.launcher import row_tiles
from hetgmp.embedding.padded.peer_payloads import payload_target
from hetgmp.embedding.padded.streams import priority_stream

# The owner's merged row-wise Adagrad update from the row kernels (scatter-add at the leaders,
# then one Adagrad launch over the leaders) instead of ~20 torch ops over every staged and
# pushed row. Tested against the torch ops in Triton's interpreter (tests/test_padded_kernels.py).
# On by default since measured on 2 H100s (bench/results/gpu/whole_step/README.md, 2026-11-26):
# the user's command on 2 GPUs 10.50M -> 12.04M samples/s, AUC equal.
FUSED_OWNER_UPDATE = True
# The own rows' entries of the merged update (their slots, counts and the slot -> leader map)
# written in the counts phase, which runs during the forward, instead of on the exchange's
# chain after backward (owner_slots' own launch: 9 us of the 2-GPU chain at batch 8192 on 2
# H100s, bench/results/gpu/scaling_diagnosis/timeline_8192_peer/); the pushes' launch then
# leaves the rows an own entry leads. Exact (tests/test_own_entries_early.py); on with
# VERSIONS_IN_UPDATE and exchange.NARROW_WAIT (that switch's note says where measured).
OWN_SLOTS_EARLY = True
# The rows' versions moved by the merged update's Adagrad launch itself (adagrad_rows'
# versions) instead of owner_version_kernel after it (6 us of that chain). Exact; on with the
# switch above (read_ahead_ab.sh variant chain: the three of them).
VERSIONS_IN_UPDATE = True
# The pushes' ids and counts written into the owners' receive rows in the counts phase (beside
# the forward, a device barrier after them), and the owner's slots launch over them run there
# too, instead of on the exchange's chain after backward (owner_slots' push launch: 9 us of the
# 2-GPU chain at batch 8192 on 2 H100s; pack then writes the pushes' gradients only). With the
# direct peer payloads, OWN_SLOTS_EARLY and the listed due mirrors. Exact
# (tests/test_push_slots_early.py; on 2 H100s tests/gpu_whole_step_check.py). On with OWN_SPLIT
# below since 2026-11-27 (bench/results/gpu/own_split/).
PUSH_SLOTS_EARLY = True
# With it, the own rows no peer pushes (most of them: a push marks the own entry it joins in the
# counts phase) take their Adagrad step right after the pre-sync kernel, on a stream of their
# own inside a whole-step capture (beside pack, the barrier and the update of the pushed rows;
# inline elsewhere), so the update after the barrier covers the pushed rows only (Adagrad's
# ~30 us was on the 2-GPU chain at batch 8192). Exact (tests/test_push_slots_early.py; the GPU
# check on 2 H100s). Measured +0.3 % and +0.5 % (two calls, medians of 2 rounds each, variant
# "ownsplit"/"allearly" of read_ahead_ab.sh): small, both paths after backward are still
# about equal (bench/results/gpu/own_split/), but exact and never slower: on.
OWN_SPLIT = True
# OWN_SPLIT's own-rows update on a stream of its own inside a whole-step capture (else inline,
# on the chain: what a GPU check tells apart when the split disagrees with the eager step).
OWN_STREAM = True
# With OWN_SPLIT on its stream: the pre-sync kernel's staging of the own rows' gradient (most of
# a batch's rows: a copy of each) launched on that stream too, before their update, so the
# chain's pre-sync launch covers the mirrors and the pushes only (the update of the pushed rows
# waits for the staging: it adds the pushes into the staged rows they join). The pre-sync
# kernel was ~20 us of the ~90-us chain at batch 8192 on 2 H100s. Exact (the same stores, on
# two streams: tests/test_push_slots_early.py; the GPU check on 2 H100s). Off: measured 1.695x
# against 1.715x alone, 1.720x with peer_allreduce.ADAM_COPY (medians of 2 rounds, variants
# "stage" / "stagecadam", bench/results/gpu/stage_beside/): no gain.
STAGE_BESIDE = False
# The rows' gradient sum in two passes (issue 30): the rows not owned here
# (mirrors, pushes) right after backward, on the exchange's stream, so the chain's pre-sync
# kernel starts after that pass alone; the own rows' pass (most of the ~70 us sum at batch 8192
# on an H100) on their update's stream, before their staging (as STAGE_BESIDE, which it
# implies), beside the chain. Each row's adds are the one sum's (tests/test_split_sum.py).
# Off: 1.59x against 1.74x one GPU on 2 H100s at batch 8192 (medians of 2 rounds; with
# ADAM_COPY 1.61x; bench/results/gpu/tail_order_s19/), probably because each pass still loads
# and sorts every occurrence's id (the pass left on the chain costs most of the whole sum) and
# the own rows' pass beside the chain slows its kernels; untimed by kernel.
SPLIT_SUM = False
# With OWN_SPLIT: the pre-sync kernel stages only the own rows a push joins (their sum starts
# from the staged row), and the own rows' early update reads the others' gradient where the
# rows' sum left it (``st.grad``), not from a staged copy. The staging copied every own row's
# gradient (most of a batch's rows: ~20 MB each way at batch 8192 x 26, dim 128) on the chain,
# where the pre-sync kernel ran 2.5x slower than alone beside the deferred product: the tail
# is throughput-bound, so only work removed shortens it (bench/results/gpu/stream_ends_s20/).
# Exact (the same values read: the whole-step GPU check passes with it). Measured on 2 H100s
# at batch 8192: 1.725x against 1.723x (2 rounds; with cadam 1.736x), nothing: the copy was not
# what the step waits for (bench/results/gpu/stage_pushed_s21/). Off.
STAGE_PUSHED_ONLY = False


def own_entries_early(st: Any) -> None:
    """(:data:`OWN_SLOTS_EARLY`) the staged own rows' entries of the merged update now (the
    update then writes the pushes' only; a staging from the host, ``load``, clears the mark)."""
    st.own_early = _own_early(st)
    if st.own_early:
        _owner_slots(st, 0, st.cap.o)


def _own_early(st: Any) -> bool:
    return bool(st.sw and FUSED_OWNER_UPDATE and OWN_SLOTS_EARLY)


def pushes_early(st: Any) -> None:
    """(:data:`PUSH_SLOTS_EARLY`, in the counts phase after the due list) the pushes' ids and
    counts into the owners' receive rows, a barrier, and the owner's slots launch over the
    pushes received (the update then sums and applies only; a staging from the host, ``load``,
    clears the mark: pack then writes the ids again and the update maps every entry)."""
    peer, st.own_split = st.peer, False
    st.pushes_early = bool(
        PUSH_SLOTS_EARLY and st.own_early and st.due_listed and peer is not None and peer.direct
    )
    if not st.pushes_early:
        return
    e, cap = st.store, st.cap
    rows, _ = payload_target(st, 1)
    _due_ns().push_ids[_grid(st.w * cap.p, 1024)](
        st.due_list, e.pending, st.pr_n, st.ndue, e.stored_ids, st.pr_ids, st.pr_cnt, rows,
        e.n_own, cap.q, cap.p, st.s1, W=st.w, WP=_p2(st.w), BR=1024,
    )  # fmt: skip
    peer.barrier_early()
    st.own_split = OWN_SPLIT
    if st.own_split:  # (the own entries a push joins, marked by the launch below)
        st.own_entries[4].zero_()
    _owner_slots(st, cap.o, st.own_entries[0].numel(), keep_own=True, mark=st.own_split)


def stages_beside(st: Any) -> bool:
    """Whether the own rows' staging runs with their update (:data:`STAGE_BESIDE`, or
    :data:`SPLIT_SUM`)."""
    return bool((STAGE_BESIDE or SPLIT_SUM) and st.own_split and st.sw)


def stages_pushed_only(st: Any) -> bool:
    """Whether the pre-sync kernel stages only the own rows a push joins
    (:data:`STAGE_PUSHED_ONLY`: with the split update, its staging not beside it)."""
    return bool(
        STAGE_PUSHED_ONLY and st.own_split and st.sw and not stages_beside(st)
        and st.grad.shape[0] >= st.cap.o  # (the own entries are the sum's first rows)
    )  # fmt: skip


def splits_sum(st: Any, ring: int) -> bool:
    """Whether the gradient sum of the batch in ring slot ``ring`` may leave its own rows'
    pass to the coming pre-sync's staging (:data:`SPLIT_SUM`): fused kernels, a whole-step
    flow whose counts phase already ran for that batch and decided a split update with the
    staging on the own rows' stream (else nothing would run beside the pass)."""
    counted = st.counted
    return bool(
        SPLIT_SUM and st.fused and st.capturing and counted is not None and counted[0] == ring
        and stages_beside(st)
    )  # fmt: skip


def sum_split(st: Any, batch: Any, grad_occ: torch.Tensor, *, zero: bool) -> torch.Tensor:
    """``batch``'s gradient (one row per occurrence) summed into ``st``'s buffer; where
    :func:`splits_sum`, the rows not owned here only, the own rows' pass held for the
    pre-sync's staging (:func:`take_own_sum`; a batch's own rows are its first
    ``Prep.blocks[rank]`` rows in block order)."""
    slot, prep = batch.ring, batch.prep
    f = None if prep is None else prep.fields
    if prep is None or not splits_sum(st, slot):
        return st.sum_grad(batch.inv, grad_occ, slot=slot, fields=f, zero=zero)
    r = st.ctx.env.rank
    edge, inv = prep.blocks[r : r + 1], batch.inv
    out = st.sum_grad(inv, grad_occ, slot=slot, fields=f, zero=zero, part=(edge, 2))
    hold_own_sum(
        st, lambda: st.sum_grad(inv, grad_occ, slot=slot, fields=f, zero=False, part=(edge, 1))
    )
    return out


def run_own_sum(st: Any) -> None:
    """A held own rows' pass no pre-sync took, on the current stream now (a step that reads the
    rows another way, the end of a capture): before anything else reads them."""
    run = take_own_sum(st)
    if run is not None:
        run()


def hold_own_sum(st: Any, run: Callable[[], None]) -> None:
    """Keep ``run`` (the own rows' pass of a split sum) for the next :func:`take_own_sum`."""
    if getattr(st, "own_sum_pending", None) is not None:
        raise RuntimeError("a split gradient sum's own rows' pass was never run")
    st.own_sum_pending = run


def take_own_sum(st: Any) -> Callable[[], None] | None:
    """The own rows' pass :func:`hold_own_sum` kept (None: none), handed over once."""
    run = getattr(st, "own_sum_pending", None)
    st.own_sum_pending = None
    return run


def own_update_early(st: Any, stage: Callable[[], None] | None = None) -> None:
    """(:data:`OWN_SPLIT`, after the pre-sync kernel staged the own rows' gradient, or
    ``stage()`` first: :data:`STAGE_BESIDE`) the own rows no push joins: their Adagrad step and
    versions now (their gradient consumed, counts zeroed), on a stream of their own inside a
    whole-step capture (joined by :func:`answer`; the pushed rows' update waits for the
    staging)."""
    if not st.own_split:
        return
    e, o = st.store, st.cap.o
    slots, cnts, pushed = st.own_entries[0], st.own_entries[1], st.own_entries[4]
    # (STAGE_PUSHED_ONLY: the rows no push joins read where the sum left them; an own row's
    # entry is its row in the batch's block order, st.grad's rows)
    grad = st.grad[:o] if stages_pushed_only(st) else st.own_gsum[:o]

    def update() -> None:  # (the entries no push joins, padding skipped: selected in the kernel)
        adagrad_rows(
            e.weight_full, e.opt_state_full, slots[:o], grad, st.lr, st.opt.eps,
            skip=(pushed[:o], e.trash_slot), backend="triton", consume=True,
            versions=(e.version_full, cnts[:o]),
        )  # fmt: skip

    if not (OWN_STREAM and st.capturing and e.device.type == "cuda"):
        if stage is not None:
            stage()
        update()
        return
    if getattr(st, "own_stream", None) is None:
        st.own_stream = priority_stream(e.device, "exchange")  # (the exchange's: highest)
    st.own_stream.wait_stream(torch.cuda.current_stream(e.device))
    with torch.cuda.stream(st.own_stream):
        if stage is not None:
            stage()
            st.own_staged = torch.cuda.Event()
            st.own_staged.record()
        update()
    st.own_forked = True


def _wait_staged(st: Any) -> None:
    """The current stream waits for the own rows' staging on their stream (STAGE_BESIDE)."""
    ev = getattr(st, "own_staged", None)
    if ev is not None:
        torch.cuda.current_stream(st.store.device).wait_event(ev)
        st.own_staged = None


def join_own(st: Any) -> None:
    """The current stream waits for :func:`own_update_early`'s stream (the answers read the
    rows it updated)."""
    if getattr(st, "own_forked", False):
        torch.cuda.current_stream(st.store.device).wait_stream(st.own_stream)
        st.own_forked = False
    st.own_staged = None  # (joined: a staging event never outlives its capture)


def _owner_slots(st: Any, e0: int, e1: int, *, keep_own: bool = False, mark: bool = False) -> None:
    """The merged update's entries ``[e0, e1)``: slots, counts and the slot -> leader map
    (:func:`merged_owner_update_fused`); ``mark``: the own entries pushes join flagged."""
    e, q, p = st.store, st.cap.q, st.cap.p
    slots, cnts = st.own_entries[0], st.own_entries[1]
    _owner_ns().slots[_grid(e1 - e0, 1024)](
        st.own_slot, st.own_cnt, st.recv1.view(torch.int64), st.sz_theirs, e.slot_of,
        slots, cnts, st.pos_map, e0, e1, st.cap.o, p, st.s1 // 2, 2 * q, e.num_rows,
        e.trash_slot, COLS=sizes.COLS, NP=sizes.NP, BLOCK=1024, KEEP_OWN=keep_own,
        pushed_ptr=st.own_entries[4], MARK=mark,
    )  # fmt: skip


def merged_owner_update_fused(st: Any) -> None:
    """:func:`.reference.merged_owner_update` in five launches (:mod:`.owner_triton`): every
    valid entry (a staged own row, a received push) finds its row's leader entry through the
    slot -> entry map (an own row leads its row: its slots launch goes last); the counts are
    added at the leaders (the count row of ``st.own_entries``), and the pushes' gradients too
    (``st.own_gsum``, whose first rows are the staged own gradient: an own row's sum starts in
    place, with no pass over the own rows; past them zero between steps: what reads them zeroes
    them); one Adagrad launch updates the leaders' rows and state; versions move by the rows'
    counts. Padding entries are skipped, so no atomics pile up on a dummy row."""
    k, e, o, p, q = _owner_ns(), st.store, st.cap.o, st.cap.p, st.cap.q
    slots, cnts, lead, csum, pushed = st.own_entries
    n = slots.numel()
    if st.pushes_early:  # (the pushes' entries too: pushes_early)
        st.pushes_early = False
    elif st.own_early:  # (the own rows' entries came with the counts phase)
        _owner_slots(st, o, n, keep_own=True)
    else:  # (pushes, then own rows: an own row leads its row)
        _owner_slots(st, o, n)
        _owner_slots(st, 0, o)
    br, bd = _tiles(st.d)
    _wait_staged(st)  # (the pushes add into the staged own rows they join)
    k.sum[_grid(n, br)](
        slots, cnts, st.pos_map, lead, csum, st.recv1, st.own_gsum, n, o, p,
        st.s1, 4 * q + 4 * p, e.trash_slot, D=st.d, BR=br, BD=bd, pushed_ptr=pushed,
        SPLIT=st.own_split,
    )  # fmt: skip
    st.own_split = False
    folded = (e.version_full, csum) if VERSIONS_IN_UPDATE else None
    adagrad_rows(
        e.weight_full, e.opt_state_full, slots, st.own_gsum, st.lr, st.opt.eps, lead=lead,
        backend="triton", consume=True, versions=folded,
    )  # fmt: skip
    if folded is None:
        k.version[_grid(n, 1024)](slots, lead, csum, e.version_full, n, BLOCK=1024)


@functools.lru_cache(maxsize=1)
def _owner_ns() -> Any:
    m = importlib.import_module("hetgmp.embedding.padded.owner_triton")
    return SimpleNamespace(
        triton=importlib.import_module("triton"),
        slots=m.owner_slots_kernel,
        sum=m.owner_sum_kernel,
        version=m.owner_version_kernel,
    )


def _grid(n: int, block: int) -> tuple[int]:
    return (max(1, _owner_ns().triton.cdiv(n, block)),)


def _p2(x: int) -> int:
    return _owner_ns().triton.next_power_of_2(x)


def _tiles(d: int) -> tuple[int, int]:
    return row_tiles(_owner_ns().triton, d)


@functools.lru_cache(maxsize=1)
def _due_ns() -> Any:
    m = importlib.import_module("hetgmp.embedding.padded.due_triton")
    return SimpleNamespace(push_ids=m.push_ids_kernel)
