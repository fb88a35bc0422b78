"""The Triton kernels of the fused pooled lookup (issue 34; this module imports triton, so only
:func:`hetgmp.models.pooling_fused._kernels` imports it). The dispatch, the autograd node and
the torch reference are in :mod:`hetgmp.models.pooling_fused`.

Both kernels walk the model's input ``[B, F + K, D]`` as ``P = B * (F + K)`` output rows. Row
``r`` is sample ``b = r // (F + K)``, field ``j = r % (F + K)``: a single-hot field (``j < F``)
is one table row, ``rows[b * F + j]``; a bag field (``j >= F``) is segment ``s = b * K + j - F``,
the table rows ``rows[B * F + off[s] .. B * F + off[s + 1]]`` (the lookup's order: the
single-hot ids, then the bag values sample by sample, field by field). ``mean_ptr [K]`` (int32)
flags the fields pooled by mean (scale ``1 / len``, an empty bag pools to zeros).

* ``pool_fwd_kernel``: ``out[r] = scale * sum of its rows`` (float32 sums, stored in
  ``out``'s dtype): the single-hot copy and the pooling in one pass, no ``cat``.
* ``pool_bwd_kernel``: every row of the lookup gets its output row's gradient times ``scale``
  (each written exactly once: the table's occurrence gradient, no ``index_select`` + ``cat``
  + slice backward).

A program takes ``BLOCK_R`` output rows and a ``BLOCK_D`` column tile and loops up to the
longest bag among its rows (masked), so a long bag costs its block, not the whole grid.
"""
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl

# P and B change with the batch: do_not_specialize (a new batch size must not compile again,
# tests/test_kernel_specialization.py). F, K (fields, fixed for a model) keep it.


@triton.jit
def _segments(off_ptr, mean_ptr, rows, P, B, F, K):
    """Per output row: its first lookup row (int64), its length and its scale."""
    rmask = rows < P
    fk = F + K
    b = rows // fk
    j = rows % fk
    bag = rmask & (j >= F)
    s = b.to(tl.int64) * K + (j - F)
    lo = tl.load(off_ptr + s, mask=bag, other=0)
    hi = tl.load(off_ptr + s + 1, mask=bag, other=0)
    single = b.to(tl.int64) * F + j
    start = tl.where(bag, B.to(tl.int64) * F + lo, single)
    cnt = tl.where(bag, hi - lo, tl.where(rmask, 1, 0)).to(tl.int32)
    mean = tl.load(mean_ptr + (j - F), mask=bag, other=0)
    inv = 1.0 / tl.maximum(cnt, 1).to(tl.float32)
    scale = tl.where(bag & (mean != 0), inv, 1.0)
    return start, cnt, scale


@triton.jit(do_not_specialize=["P", "B"])
def pool_fwd_kernel(rows_ptr, off_ptr, mean_ptr, out_ptr, P, B, F, K, D: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    start, cnt, scale = _segments(off_ptr, mean_ptr, rows, P, B, F, K)
    acc = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
    longest = tl.max(cnt, axis=0)
    for t in range(0, longest):
        m = (t < cnt)[:, None] & cmask[None, :]
        src = rows_ptr + (start + t)[:, None] * D + cols[None, :]
        acc += tl.load(src, mask=m, other=0.0).to(tl.float32)
    acc = acc * scale[:, None]
    dst = out_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=(rows < P)[:, None] & cmask[None, :])


@triton.jit(do_not_specialize=["P", "B"])
def pool_bwd_kernel(grad_ptr, off_ptr, mean_ptr, out_ptr, P, B, F, K, D: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    start, cnt, scale = _segments(off_ptr, mean_ptr, rows, P, B, F, K)
    src = grad_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :]
    g = tl.load(src, mask=(rows < P)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    g = (g * scale[:, None]).to(out_ptr.dtype.element_ty)
    longest = tl.max(cnt, axis=0)
    for t in range(0, longest):
        m = (t < cnt)[:, None] & cmask[None, :]
        tl.store(out_ptr + (start + t)[:, None] * D + cols[None, :], g, mask=m)


@triton.jit(do_not_specialize=["start", "n", "S"])
def zero_tail_kernel(out_ptr, off_ptr, start, n, S, D: tl.constexpr, BLOCK_R: tl.constexpr,
                     BLOCK_D: tl.constexpr):  # fmt: skip
    # A compact lookup's tail (BagLayout.capacity): the rows past its bag values (from start +
    # off[S] up to n) belong to no bag; their gradient is zero (pool_bwd_kernel writes none)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R) + start
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    first = start + tl.load(off_ptr + S)
    m = ((rows >= first) & (rows < n))[:, None] & (cols < D)[None, :]
    zero = tl.zeros((BLOCK_R, BLOCK_D), out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], zero, mask=m)
