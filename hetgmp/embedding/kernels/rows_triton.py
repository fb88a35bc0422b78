"""The Triton row kernels (module-level ``@triton.jit`` functions; this module imports triton,
so it is imported only by :func:`hetgmp.embedding.kernels.launcher._triton`).

``scatter_add_rows_kernel`` (relaxed atomic adds of row tiles), ``take_rows_kernel``
(gather), ``put_rows_kernel`` (scatter copy), and the one-rank lookup's ``mark_local_kernel``
(clamp + range flag + leader map) and ``take_local_kernel`` (rows + leaders + distinct count).
Their torch references and the dispatching wrappers are in :mod:`.rows`.
"""
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl

# The number of ids or rows (n) changes with the batch: do_not_specialize. Triton otherwise
# compiles a kernel again for an int that is 1 or not a multiple of 16, and the first partial
# batch of an epoch (or an evaluation batch of another size) stalled ~5 s on 2 H100s while
# ptxas ran (tests/test_kernel_specialization.py checks every kernel). The table's num_rows
# (fixed for a run) keeps it; D and the tiles are constexprs.


@triton.jit
def in_part(idx, edge_ptr, PART: tl.constexpr):
    # (PART 0: every index; 1: those below the edge read at edge_ptr; 2: those at or above)
    if PART == 0:
        return idx >= 0
    edge = tl.load(edge_ptr).to(tl.int64)
    if PART == 1:
        return (idx >= 0) & (idx < edge)
    return idx >= edge


@triton.jit(do_not_specialize=["n"])
def scatter_add_rows_kernel(
    table_ptr,
    idx_ptr,
    src_ptr,
    n,
    alpha,
    edge_ptr,
    D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PART: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n
    idx = tl.load(idx_ptr + rows, mask=rmask, other=0).to(tl.int64)
    rmask = rmask & in_part(idx, edge_ptr, PART)  # (a negative index: padding, skipped)
    add_rows(table_ptr, src_ptr, idx, rows, rmask, alpha, D, BLOCK_D)


@triton.jit
def _segment_add(f1, v1, f2, v2):
    # a segmented sum's combine: a run starts where the flag is set
    return f1 | f2, tl.where(f2 != 0, v2, v1 + v2)


KEY_PAD = tl.constexpr(2**63 - 1)  # (a masked lane's sort key: it sorts last)


@triton.jit(do_not_specialize=["b_rows"])
def scatter_add_fields_kernel(
    table_ptr, idx_ptr, src_ptr, b_rows, alpha, edge_ptr, F: tl.constexpr, D: tl.constexpr,
    BS: tl.constexpr, LB: tl.constexpr, BLOCK_D: tl.constexpr, PART: tl.constexpr,
):  # fmt: skip
    # table[idx[b, f]] += alpha * src[b, f] for BS samples b of one field f per program: the
    # program's occurrences sorted by row, summed per run in registers (a segmented scan),
    # then one atomic per run instead of one per occurrence. Why: a field's hot rows recur
    # across a batch's samples and their atomics serialised on one address (the rows'
    # gradient sum was ~100 us of a 0.62 ms WDL step at batch 8192 on an H100, the largest
    # kernel; 140 us on 2 GPUs).
    lane = tl.arange(0, BS)
    b = tl.program_id(0) * BS + lane
    f = tl.program_id(1)
    m = b < b_rows
    idx = tl.load(idx_ptr + b.to(tl.int64) * F + f, mask=m, other=-1).to(tl.int64)
    key = tl.sort(tl.where(m & in_part(idx, edge_ptr, PART), (idx << LB) | lane, KEY_PAD))
    live = key != KEY_PAD
    row = key >> LB
    start = (lane == 0) | (row != tl.gather(row, tl.maximum(lane - 1, 0), 0))
    end = live & ((lane == BS - 1) | (row != tl.gather(row, tl.minimum(lane + 1, BS - 1), 0)))
    occ = (tl.program_id(0) * BS + (key & (BS - 1))).to(tl.int64) * F + f
    flag = tl.broadcast_to(start[:, None].to(tl.int32), (BS, BLOCK_D))
    for d0 in tl.static_range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        cm = (cols < D)[None, :]
        g = tl.load(src_ptr + occ[:, None] * D + cols[None, :], mask=live[:, None] & cm, other=0.0)
        _, run = tl.associative_scan((flag, g.to(tl.float32) * alpha), 0, _segment_add)
        tl.atomic_add(
            table_ptr + row[:, None] * D + cols[None, :], run, mask=end[:, None] & cm,
            sem="relaxed",
        )  # fmt: skip


@triton.jit
def add_rows(table_ptr, src_ptr, idx, rows, rmask, alpha, D: tl.constexpr, BLOCK_D: tl.constexpr):
    # table[idx] += alpha * src[rows] where rmask, whole rows in column tiles, atomically (a
    # bf16 / fp16 gradient is added in float32)
    src_row = rows.to(tl.int64) * D
    dst_row = idx * D
    for d0 in tl.static_range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        m = rmask[:, None] & (cols < D)[None, :]
        g = tl.load(src_ptr + src_row[:, None] + cols[None, :], mask=m, other=0.0)
        tl.atomic_add(
            table_ptr + dst_row[:, None] + cols[None, :], g.to(tl.float32) * alpha, mask=m,
            sem="relaxed",
        )  # fmt: skip


@triton.jit
def _copy_rows(src_ptr, dst_ptr, src_i, dst_i, rmask, D: tl.constexpr, BLOCK_D: tl.constexpr):
    # dst[dst_i] = src[src_i], whole rows in column tiles (64-bit row offsets)
    src_row = src_i.to(tl.int64) * D
    dst_row = dst_i.to(tl.int64) * D
    for d0 in tl.static_range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        m = rmask[:, None] & (cols < D)[None, :]
        v = tl.load(src_ptr + src_row[:, None] + cols[None, :], mask=m, other=0.0)
        v = v.to(dst_ptr.dtype.element_ty)  # (rows may leave in the autocast dtype)
        tl.store(dst_ptr + dst_row[:, None] + cols[None, :], v, mask=m)


@triton.jit(do_not_specialize=["n"])
def take_rows_kernel(
    table_ptr, idx_ptr, out_ptr, n, D: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr, SKIP: tl.constexpr = False,
):  # fmt: skip
    # out[i] = table[idx[i]] (few arguments: Triton's launch cost grows with them); SKIP: a
    # negative idx[i] leaves out[i] as it was (and reads nothing: rows in host memory)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n
    idx = tl.load(idx_ptr + rows, mask=rmask, other=0).to(tl.int64)
    if SKIP:
        rmask = rmask & (idx >= 0)
    _copy_rows(table_ptr, out_ptr, idx, rows, rmask, D, BLOCK_D)


@triton.jit(do_not_specialize=["n"])
def take_local_kernel(
    table_ptr, idx_ptr, out_ptr, n, pos_ptr, lead_ptr, step_ptr, total_ptr, flag_ptr,
    D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # take_rows + lead[i] = pos[idx[i]], the leaders (lead[i] == i) counted into *step and
    # *total, *flag cleared (see take_local)
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n
    idx = tl.load(idx_ptr + rows, mask=rmask, other=0).to(tl.int64)
    lead = tl.load(pos_ptr + idx, mask=rmask, other=-1)
    tl.store(lead_ptr + rows, lead, mask=rmask)
    k = tl.sum((lead == rows).to(tl.int64), axis=0)
    tl.atomic_add(step_ptr, k, sem="relaxed")
    tl.atomic_add(total_ptr, k, sem="relaxed")
    if pid == 0:
        tl.store(flag_ptr, 0)
    _copy_rows(table_ptr, out_ptr, idx, rows, rmask, D, BLOCK_D)


@triton.jit(do_not_specialize=["n"])
def mark_local_kernel(
    ids_ptr, slots_ptr, pos_ptr, flag_ptr, step_ptr, n, num_rows, BLOCK: tl.constexpr
):
    # slots = clamp(ids), pos[slots[i]] = i (any writer may win), *flag = max(#bad ids)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(ids_ptr + offs, mask=m, other=0)
    c = tl.minimum(tl.maximum(x, 0), num_rows - 1)
    tl.store(slots_ptr + offs, c, mask=m)
    tl.store(pos_ptr + c, offs, mask=m)
    nbad = tl.sum(((x != c) & m).to(tl.int32), axis=0)
    tl.atomic_max(flag_ptr, nbad, sem="relaxed")
    if pid == 0:
        tl.store(step_ptr, 0)


@triton.jit(do_not_specialize=["n"])
def put_rows_kernel(
    dst_ptr, idx_ptr, src_ptr, n, D: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    # dst[idx[i]] = src[i] (a repeated target: any one writer wins)
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n
    idx = tl.load(idx_ptr + rows, mask=rmask, other=0).to(tl.int64)
    rmask = rmask & (idx >= 0)  # a negative index: skipped (padding)
    _copy_rows(src_ptr, dst_ptr, rows, idx, rmask, D, BLOCK_D)


@triton.jit(do_not_specialize=["n"])
def adagrad_rows_kernel(
    w_ptr, state_ptr, idx_ptr, g_ptr, sel_ptr, ver_ptr, cnt_ptr, n, lr, eps, skip,
    D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, SEL: tl.constexpr,
    CONSUME: tl.constexpr, VERSIONS: tl.constexpr = False,
):  # fmt: skip
    # row-wise Adagrad on rows idx[i] with gradient g[i]: s += mean(g^2), w -= lr g / (sqrt s
    # + eps); SEL 1: only entries with sel[i] != 0 (bool mask), SEL 2: only entries with
    # sel[i] == i (int32 leader positions), SEL 3: only entries with sel[i] == 0 (int64 marks)
    # and idx[i] != skip; a negative idx: skipped; CONSUME: the selected
    # gradient rows are set to zero once used; VERSIONS: each selected row's version
    # ver[idx[i]] also moves by cnt[i], which is then zeroed (int64 both)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n
    idx = tl.load(idx_ptr + rows, mask=rmask, other=-1).to(tl.int64)
    rmask = rmask & (idx >= 0)
    if SEL == 1:
        rmask = rmask & (tl.load(sel_ptr + rows, mask=rmask, other=0) != 0)
    if SEL == 2:
        rmask = rmask & (tl.load(sel_ptr + rows, mask=rmask, other=-1) == rows)
    if SEL == 3:
        rmask = rmask & (tl.load(sel_ptr + rows, mask=rmask, other=1) == 0) & (idx != skip)
    if VERSIONS:
        c = tl.load(cnt_ptr + rows, mask=rmask, other=0)
        tl.store(ver_ptr + idx, tl.load(ver_ptr + idx, mask=rmask, other=0) + c, mask=rmask)
        tl.store(cnt_ptr + rows, c * 0, mask=rmask)
    g_row = rows.to(tl.int64) * D
    ss = tl.zeros([BLOCK_R], dtype=tl.float32)
    for d0 in tl.static_range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        m = rmask[:, None] & (cols < D)[None, :]
        g = tl.load(g_ptr + g_row[:, None] + cols[None, :], mask=m, other=0.0)
        ss += tl.sum(g * g, axis=1)
    s = tl.load(state_ptr + idx, mask=rmask, other=0.0) + ss / D
    tl.store(state_ptr + idx, s, mask=rmask)
    scale = lr / (tl.sqrt(s) + eps)
    w_row = idx * D
    for d0 in tl.static_range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        m = rmask[:, None] & (cols < D)[None, :]
        gs = g_ptr + g_row[:, None] + cols[None, :]
        g = tl.load(gs, mask=m, other=0.0)
        ws = w_ptr + w_row[:, None] + cols[None, :]
        tl.store(ws, tl.load(ws, mask=m) - g * scale[:, None], mask=m)
        if CONSUME:
            tl.store(gs, tl.zeros_like(g), mask=m)
