"""The Triton kernels of :mod:`.local_now` (this module imports triton: :mod:`.local_now` imports
it only when the fused path runs). One pass each over a batch's unique rows in block order;
the torch ops in :mod:`.local_now` are their reference (tests/test_local_now_kernels.py).

Why fused: the torch version sent every entry not stored here (padding, rows of other ranks)
to one trash row, thousands of atomics on one address, and made ~10 passes over the rows; on
2 H100s reading ahead then ran slower than the strict step (batch 8192: 12.6M vs 16.9M
samples/s, 2026-11-26).
"""
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _stored(blocks_ptr, rank, i, u, W: tl.constexpr, WP: tl.constexpr):
    # (own, mirror) masks of entries i: own rows first, then mirrors by owner (block order)
    j = tl.arange(0, WP)
    n_o = tl.load(blocks_ptr + rank)
    n_s = n_o + tl.sum(tl.load(blocks_ptr + W + j, mask=j < W, other=0), 0)
    live = i < u
    return live & (i < n_o), live & (i >= n_o) & (i < n_s)


@triton.jit(do_not_specialize=["u"])
def apply_stored_kernel(
    blocks_ptr, slot_ptr, g_ptr, w_ptr, state_ptr, dacc_ptr, gacc_ptr, rank, u, n_own,
    neg_lr, eps, W: tl.constexpr, WP: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
    BD: tl.constexpr, SW: tl.constexpr,
):  # fmt: skip
    # own rows: the optimizer's step; mirrors: the local step and both accumulators; then the
    # entries' gradient zeroed (SW 1: row-wise Adagrad, state += mean(g^2), per stored slot)
    i = tl.program_id(0) * BR + tl.arange(0, BR)
    own, mir = _stored(blocks_ptr, rank, i, u, W, WP)
    stored = own | mir
    s = tl.load(slot_ptr + i, mask=stored, other=0).to(tl.int64)
    gi = i.to(tl.int64) * D
    scale = tl.zeros([BR], dtype=tl.float32) + neg_lr
    if SW:
        ss = tl.zeros([BR], dtype=tl.float32)
        for d0 in tl.static_range(0, D, BD):
            c = d0 + tl.arange(0, BD)
            m = stored[:, None] & (c < D)[None, :]
            g = tl.load(g_ptr + gi[:, None] + c[None, :], mask=m, other=0.0)
            ss += tl.sum(g * g, axis=1)
        state = tl.load(state_ptr + s, mask=stored, other=0.0) + ss / D
        tl.store(state_ptr + s, state, mask=stored)
        scale = neg_lr / (tl.sqrt(state) + eps)
    s_off = s * D
    m_off = tl.where(mir, s - n_own, 0) * D
    for d0 in tl.static_range(0, D, BD):
        c = d0 + tl.arange(0, BD)
        cm = (c < D)[None, :]
        sm = stored[:, None] & cm
        mm = mir[:, None] & cm
        gp = g_ptr + gi[:, None] + c[None, :]
        g = tl.load(gp, mask=sm, other=0.0)
        delta = g * scale[:, None]
        ws = w_ptr + s_off[:, None] + c[None, :]
        tl.store(ws, tl.load(ws, mask=sm) + delta, mask=sm)
        da = dacc_ptr + m_off[:, None] + c[None, :]
        tl.store(da, tl.load(da, mask=mm) + delta, mask=mm)
        ga = gacc_ptr + m_off[:, None] + c[None, :]
        tl.store(ga, tl.load(ga, mask=mm) + g, mask=mm)
        tl.store(gp, g * 0.0, mask=sm)


@triton.jit(do_not_specialize=["u"])
def refresh_stored_kernel(
    blocks_ptr, slot_ptr, w_ptr, values_ptr, rank, u, W: tl.constexpr, WP: tl.constexpr,
    D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    # values[i] = the table's row of every stored entry i (own rows and mirrors)
    i = tl.program_id(0) * BR + tl.arange(0, BR)
    own, mir = _stored(blocks_ptr, rank, i, u, W, WP)
    stored = own | mir
    s_off = tl.load(slot_ptr + i, mask=stored, other=0).to(tl.int64) * D
    v_off = i.to(tl.int64) * D
    for d0 in tl.static_range(0, D, BD):
        c = d0 + tl.arange(0, BD)
        sm = stored[:, None] & (c < D)[None, :]
        row = tl.load(w_ptr + s_off[:, None] + c[None, :], mask=sm, other=0.0)
        tl.store(values_ptr + v_off[:, None] + c[None, :], row, mask=sm)
