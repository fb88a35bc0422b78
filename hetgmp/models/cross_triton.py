"""The Triton kernels of DCN's fused cross network (this module imports triton, so only
:func:`hetgmp.models.cross._kernels` imports it). The math, the dispatch and the torch reference
are in :mod:`hetgmp.models.cross`.

Every row's input is two segments side by side: ``xa`` (the flat embeddings, ``Ka`` columns) and
``xb`` (the dense features, ``Kb`` columns, possibly none), so the ``[B, Ka + Kb]`` input is
never concatenated. ``w`` is ``[L + 1, Ka + Kb]`` float32: the ``L`` cross weights, then the
output layer's cross columns ``u``. ``q`` is ``[L + 1]`` float32 (weight-only terms).

* ``cross_fwd_kernel``: one program per ``BLOCK_B`` rows; one pass over the row's columns gives
  the ``L + 1`` dot products ``P = x0 . w`` (float32), then the per-row scalar recurrence gives
  the logit ``y``. Writes ``y [B]`` and ``P [B, LP]`` (all backward needs besides ``x0``).
* ``cross_bwd_kernel``: a 2-D grid (row groups x column tiles); each program recomputes the
  per-row gradients of ``P`` from ``P``, ``q`` and ``dy`` (a few scalars per row), writes its
  tile of ``dx0 = dP @ w`` and accumulates ``dP^T x0`` over its rows into one partial
  ``[LP, BLOCK_K]`` of the weight gradient, and (column tile 0) the row sums of ``dq``. The
  partials are summed over the row groups by the caller (deterministic two-stage reduction).
"""
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl

# The batch's rows (B, and rows_per_group derived from it) change with the batch:
# do_not_specialize. Triton otherwise compiles a kernel again for an int that is 1 or not a
# multiple of 16, and the first partial batch of an epoch (or an evaluation batch of another
# size) stalled ~5 s on 2 H100s while ptxas ran (tests/test_kernel_specialization.py checks
# every kernel). The widths Ka, Kb and the strides (fixed for a model) keep it: aligned
# accesses.


@triton.jit
def _col(t, lidx, j):
    """Column ``j`` of a ``[BLOCK_B, LP]`` tile as a ``[BLOCK_B]`` vector."""
    return tl.sum(tl.where(lidx[None, :] == j, t, 0.0), axis=1)


@triton.jit
def _dots(acc, x_ptr, stride_x, rows64, rmask, w_ptr, stride_w, wcol0, width, lidx,
          L: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """``acc[:, j] += x[rows, :width] . w[j, wcol0 : wcol0 + width]`` for every ``j <= L``."""
    cols = tl.arange(0, BLOCK_K)
    for k0 in range(0, width, BLOCK_K):
        c = k0 + cols
        cm = c < width
        m = rmask[:, None] & cm[None, :]
        x = tl.load(x_ptr + rows64[:, None] * stride_x + c[None, :], mask=m, other=0.0)
        x = x.to(tl.float32)
        for j in tl.static_range(L + 1):
            w = tl.load(w_ptr + j * stride_w + wcol0 + c, mask=cm, other=0.0)
            p = tl.sum(x * w[None, :], axis=1)
            acc += tl.where(lidx[None, :] == j, p[:, None], 0.0)
    return acc


@triton.jit(do_not_specialize=["B"])
def cross_fwd_kernel(xa_ptr, xb_ptr, w_ptr, q_ptr, y_ptr, p_ptr, B, Ka, Kb, stride_a, stride_b,
                     stride_w, L: tl.constexpr, LP: tl.constexpr, BLOCK_B: tl.constexpr,
                     BLOCK_K: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    rows = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    rmask = rows < B
    rows64 = rows.to(tl.int64)
    lidx = tl.arange(0, LP)
    acc = tl.zeros((BLOCK_B, LP), tl.float32)
    acc = _dots(acc, xa_ptr, stride_a, rows64, rmask, w_ptr, stride_w, 0, Ka, lidx, L, BLOCK_K)
    acc = _dots(acc, xb_ptr, stride_b, rows64, rmask, w_ptr, stride_w, Ka, Kb, lidx, L, BLOCK_K)
    # x_l = x0 * a_l + c_l (a_0 = 1, c_l = b_0 + ... + b_{l-1}): s_l = x_l . w_l = a_l p_l + q_l
    a = tl.full((BLOCK_B,), 1.0, tl.float32)
    for j in tl.static_range(L):
        a = a + a * _col(acc, lidx, j) + tl.load(q_ptr + j)
    y = a * _col(acc, lidx, L) + tl.load(q_ptr + L)
    tl.store(y_ptr + rows, y, mask=rmask)
    tl.store(p_ptr + rows64[:, None] * LP + lidx[None, :], acc, mask=rmask[:, None])


@triton.jit
def _row_grads(P, gy, q_ptr, lidx, L: tl.constexpr, LP: tl.constexpr):
    """Per row: the gradients of ``P`` (``dP``) and of ``q`` (``dq``), both ``[BLOCK_B, LP]``,
    from the saved dots ``P`` and the logit's gradient ``gy``."""
    a = gy * 0.0 + 1.0
    A = tl.where(lidx[None, :] == 0, a[:, None], 0.0)  # A[:, j] = a_j
    for j in tl.static_range(L):
        a = a + a * _col(P, lidx, j) + tl.load(q_ptr + j)
        A = tl.where(lidx[None, :] == j + 1, a[:, None], A)
    top = lidx[None, :] == L
    dP = tl.where(top, (gy * a)[:, None], 0.0)
    dq = tl.where(top, gy[:, None], 0.0)
    ga = gy * _col(P, lidx, L)  # d y / d a_L
    for i in tl.static_range(L):  # j = L-1 .. 0: a_{j+1} = a_j (1 + p_j) + q_j
        j = L - 1 - i
        at = lidx[None, :] == j
        dP = tl.where(at, (ga * _col(A, lidx, j))[:, None], dP)
        dq = tl.where(at, ga[:, None], dq)
        ga = ga * (1.0 + _col(P, lidx, j))
    return dP, dq


@triton.jit
def _bwd_tile(x_ptr, gx_ptr, stride_x, stride_gx, width, col0, wcol0, w_ptr, stride_w, q_ptr,
              p_ptr, gy_ptr, part_ptr, gq_ptr, row0, row_end, g, K, L: tl.constexpr,
              LP: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """Rows ``[row0, row_end)`` x columns ``[col0, col0 + BLOCK_K)`` of one input segment."""
    cols = col0 + tl.arange(0, BLOCK_K)
    cm = cols < width
    lidx = tl.arange(0, LP)
    acc_w = tl.zeros((LP, BLOCK_K), tl.float32)
    acc_q = tl.zeros((LP,), tl.float32)
    for r in range(row0, row_end, BLOCK_B):
        rows = r + tl.arange(0, BLOCK_B)
        rm = rows < row_end
        rows64 = rows.to(tl.int64)
        P = tl.load(p_ptr + rows64[:, None] * LP + lidx[None, :], mask=rm[:, None], other=0.0)
        gy = tl.load(gy_ptr + rows, mask=rm, other=0.0)
        dP, dq = _row_grads(P, gy, q_ptr, lidx, L, LP)
        acc_q += tl.sum(dq, axis=0)
        m = rm[:, None] & cm[None, :]
        x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=m, other=0.0)
        x = x.to(tl.float32)
        gx = tl.zeros((BLOCK_B, BLOCK_K), tl.float32)
        for j in tl.static_range(L + 1):
            w = tl.load(w_ptr + j * stride_w + wcol0 + cols, mask=cm, other=0.0)
            dpl = _col(dP, lidx, j)
            gx += dpl[:, None] * w[None, :]
            acc_w += tl.where(lidx[:, None] == j, tl.sum(dpl[:, None] * x, axis=0)[None, :], 0.0)
        gx_at = gx_ptr + rows64[:, None] * stride_gx + cols[None, :]
        tl.store(gx_at, gx.to(gx_ptr.dtype.element_ty), mask=m)
    part = part_ptr + g.to(tl.int64) * LP * K
    tl.store(part + lidx[:, None] * K + wcol0 + cols[None, :], acc_w, mask=cm[None, :])
    if col0 + wcol0 == 0:  # one program per row group writes the row sums of dq
        tl.store(gq_ptr + g * LP + lidx, acc_q)


@triton.jit(do_not_specialize=["B", "rows_per_group"])
def cross_bwd_kernel(xa_ptr, xb_ptr, gxa_ptr, gxb_ptr, w_ptr, q_ptr, p_ptr, gy_ptr, part_ptr,
                     gq_ptr, B, Ka, Kb, stride_a, stride_b, stride_ga, stride_gb, stride_w,
                     rows_per_group, L: tl.constexpr, LP: tl.constexpr, BLOCK_B: tl.constexpr,
                     BLOCK_K: tl.constexpr):  # fmt: skip
    g = tl.program_id(0)
    c = tl.program_id(1)
    n_a = tl.cdiv(Ka, BLOCK_K)
    row0 = g * rows_per_group
    row_end = tl.minimum(row0 + rows_per_group, B)
    K = Ka + Kb
    if c < n_a:
        _bwd_tile(xa_ptr, gxa_ptr, stride_a, stride_ga, Ka, c * BLOCK_K, 0, w_ptr, stride_w,
                  q_ptr, p_ptr, gy_ptr, part_ptr, gq_ptr, row0, row_end, g, K, L, LP, BLOCK_B,
                  BLOCK_K)  # fmt: skip
    else:
        _bwd_tile(xb_ptr, gxb_ptr, stride_b, stride_gb, Kb, (c - n_a) * BLOCK_K, Ka, w_ptr,
                  stride_w, q_ptr, p_ptr, gy_ptr, part_ptr, gq_ptr, row0, row_end, g, K, L, LP,
                  BLOCK_B, BLOCK_K)  # fmt: skip
