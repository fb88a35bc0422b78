"""The Triton kernels of the epoch-start scan (:mod:`.epoch_scan`; this module imports triton,
so that module imports it only when the kernel path runs)."""
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl

# The batch's samples (s) and the batch stamp change with every launch: do_not_specialize
# (tests/test_kernel_specialization.py; else a partial last batch compiles it again).


@triton.jit
def _batch_ids(sparse_ptr, pos_ptr, b0, s, num_rows, F: tl.constexpr, BLOCK: tl.constexpr):
    # occurrences o of the batch whose samples are positions[b0 : b0 + s]: their clamped ids
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < s * F
    row = tl.load(pos_ptr + b0 + o // F, mask=m, other=0).to(tl.int64)
    x = tl.load(sparse_ptr + row * F + o % F, mask=m, other=0).to(tl.int64)
    return tl.minimum(tl.maximum(x, 0), num_rows - 1), m


@triton.jit(do_not_specialize=["b0", "s", "stamp", "out_row"])
def epoch_counts_kernel(
    sparse_ptr, pos_ptr, stamp_ptr, occ_ptr, block_ptr, counts_ptr, b0, s, stamp, out_row,
    num_rows, bound, F: tl.constexpr, W: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr,
    HOT: tl.constexpr,
):  # fmt: skip
    # one batch: each row's first occurrence here is the one whose atomic exchange finds
    # another stamp (rows are stamped with the batch's own), counted in the row's column
    # (mirror of owner j: j; not stored, owner j: W + j; owned: 2W); HOT: each row's
    # (bound + 1)-th occurrence counted in column 2W + 1 (occ: the rows' occurrences so far,
    # zero between batches: epoch_clear_kernel)
    c, m = _batch_ids(sparse_ptr, pos_ptr, b0, s, num_rows, F, BLOCK)
    old = tl.atomic_xchg(stamp_ptr + c, (tl.zeros_like(c) + stamp).to(tl.int32), mask=m)
    first = m & (old != stamp)
    blk = tl.load(block_ptr + c, mask=first, other=0)
    col = tl.where(blk >= W, blk - W, 2 * W)
    col = tl.where(first, col, NB - 1)  # (others: a bin past the columns)
    hist = tl.histogram(col, NB)
    k = tl.arange(0, NB)
    keep = (k < 2 * W + 1) & (hist > 0)
    tl.atomic_add(counts_ptr + out_row * (2 * W + 2) + k, hist.to(tl.int64), mask=keep,
                  sem="relaxed")  # fmt: skip
    if HOT:
        seen = tl.atomic_add(occ_ptr + c, 1, mask=m, sem="relaxed")
        hot = tl.sum((m & (seen == bound)).to(tl.int64), 0)
        if hot > 0:
            tl.atomic_add(counts_ptr + out_row * (2 * W + 2) + 2 * W + 1, hot, sem="relaxed")


@triton.jit(do_not_specialize=["b0", "s"])
def epoch_clear_kernel(
    sparse_ptr, pos_ptr, occ_ptr, b0, s, num_rows, F: tl.constexpr, BLOCK: tl.constexpr
):
    # the batch's rows' occurrence counts back to zero (for the next batch)
    c, m = _batch_ids(sparse_ptr, pos_ptr, b0, s, num_rows, F, BLOCK)
    tl.store(occ_ptr + c, tl.zeros_like(c).to(tl.int32), mask=m)
