"""The Triton kernels of :mod:`.prefill`: the next batch's occurrence rows written in the
exchange's tail, the stored rows first, then the rows finish wrote (module-level
``@triton.jit`` functions; imported only where a fused segment runs)."""
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl

from hetgmp.embedding.kernels.rows_triton import _copy_rows
from hetgmp.embedding.padded.kernels_triton import _block_starts


@triton.jit(do_not_specialize=["n"])
def prefill_stored_kernel(
    w_ptr, blocks_ptr, slot_ptr, inv_ptr, out_ptr, n, W: tl.constexpr, B3: tl.constexpr,
    D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # out[o] = the table's row slot[inv[o]] where that distinct row is stored here (own rows and
    # mirrors: the first 2W of the 3W blocks); the others are left for prefill_redo_kernel
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n
    i = tl.load(inv_ptr + rows, mask=rmask, other=0).to(tl.int64)
    ends, starts, t = _block_starts(blocks_ptr, W, B3)
    seg = tl.sum(((ends[None, :] <= i[:, None]) & (t < 3 * W)[None, :]).to(tl.int32), axis=1)
    stored = rmask & (seg < 2 * W)
    s = tl.load(slot_ptr + i, mask=stored, other=0).to(tl.int64)
    _copy_rows(w_ptr, out_ptr, s, rows, stored, D, BLOCK_D)


@triton.jit(do_not_specialize=["n"])
def prefill_redo_kernel(
    w_ptr, src_ptr, redo_ptr, values_ptr, inv_ptr, out_ptr, n, D: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # out[o] again where finish wrote its distinct row (redo: a row not stored here, from the
    # reply into values; a mirror refreshed beyond the bound, into the table at src)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n
    i = tl.load(inv_ptr + rows, mask=rmask, other=0).to(tl.int64)
    r = rmask & (tl.load(redo_ptr + i, mask=rmask, other=0) != 0)
    s = tl.load(src_ptr + i, mask=r, other=-1)
    _copy_rows(w_ptr, out_ptr, tl.maximum(s, 0), rows, r & (s >= 0), D, BLOCK_D)
    _copy_rows(values_ptr, out_ptr, i, rows, r & (s < 0), D, BLOCK_D)
