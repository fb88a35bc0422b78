"""Fused GPU kernels of the embedding runtime, each next to the plain-torch reference it must match.

Row kernels (``table [R, D]`` contiguous; whole rows in tiles, one 64-bit offset per row):
``scatter_add_rows`` (``index_add_``), ``take_rows`` (``index_select``), ``put_rows``
(``index_copy_``); the one-rank lookup's two kernels, ``mark_local`` and ``take_local``, are in
:mod:`.local_lookup`; and ``gather_rows``, a
differentiable ``values[inv]``. Measured on an H200 (``bench/gpu/bench_kernels.py``,
``bench/results/gpu/kernels_H200.md``): update 2.6-2.7x ``index_add_``, gather 3.0-3.3x
``index_select``; a launch costs ~21 us of host time vs ~7 us for a torch op.

``gather_rows(values, inv, backend)`` is ``values[inv]`` whose backward sums the gradient of
repeated rows with :func:`scatter_add_rows` (atomics on the Triton backend) instead of torch's
sort-based ``embedding_dense_backward`` (a radix sort, segment sums and about eight kernels).

``scatter_add_rows(table, idx, src, alpha)`` is ``table.index_add_(0, idx, src, alpha=alpha)``:
the SGD update of every looked-up row (repeats included). Why a kernel of our own: on an H200
torch's ``index_add_`` spends 0.29 ms on a Criteo batch (8192 x 26 rows of 128 floats, 27M
element-wise atomics) because it computes every element's offset through generic strided
``TensorInfo`` index math and adds with ordered atomics; the Triton kernel here handles a tile of
rows x columns per program (contiguous rows, one 64-bit row offset per row) and adds with
*relaxed* atomics (a sum needs no ordering). Repeated rows (hot ids) simply add twice, which is
what ``index_add_`` does too. Float addition order differs between the two (both are
non-deterministic on CUDA), so tests compare with a tolerance.

Backends (``KERNELS``): ``"torch"`` (the reference, any device) and ``"triton"`` (CUDA tensors,
needs the ``triton`` package that CUDA builds of torch ship with). ``"auto"`` picks ``triton``
for CUDA tensors when it imports and ``torch`` otherwise (CPU included); :func:`resolve` says which one a run
uses so callers can log it. ``"auto"`` also compiles and runs every kernel once on the device
and falls back to torch with a warning if that fails; an explicit ``"triton"`` raises instead.
Set ``TRITON_INTERPRET=1`` to run the Triton kernels on CPU tensors (slow; tests).

Every kernel is launched through :func:`launch`, which keeps the compiled kernel per
specialization key and calls its launcher directly (Triton's ``kernel[grid](...)`` costs ~21 us
of host time per launch on the H200 machine); ``HETGMP_FAST_LAUNCH=0`` or
``FAST_LAUNCH = False`` turns that off. ``bench/gpu/host_overhead.py --launch`` measures both.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from hetgmp.choices import KERNELS  # (--help shows them without torch)
from hetgmp.embedding.kernels.launcher import (
    _kernels,
    interpreted,
    launch,
    on_device,
    row_tiles,
    triton_available,
)
from hetgmp.embedding.kernels.local_lookup import mark_local, take_local
from hetgmp.embedding.kernels.prep import trial as prep_trial
from hetgmp.embedding.ops import index_add_rows


def resolve(kernels: str, device: torch.device) -> str:
    """The backend ``kernels`` (one of :data:`KERNELS`) means on ``device``."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
    if kernels == "torch":
        return "torch"
    why = triton_available()
    if kernels == "auto":  # the interpreter is for tests: "auto" never picks it
        if device.type != "cuda" or why is not None:
            return "torch"
        why = _trial_launch(device)
        if why is not None:  # e.g. no C compiler for Triton's launcher: say so, use torch
            warnings.warn(f"Triton kernels do not run here ({why}); using torch's", stacklevel=2)
            return "torch"
        return "triton"
    if device.type != "cuda" and not interpreted():
        raise ValueError(
            f"kernels='triton' needs CUDA tensors (got {device}); use 'auto' or 'torch'"
        )
    if why is not None:
        raise RuntimeError(f"kernels='triton' was asked for but Triton does not import: {why}")
    return "triton"


@functools.cache
def _trial_launch(device: torch.device) -> str | None:
    """Compile and run every kernel on a tiny table of ``device`` and check the results
    (Triton builds its launcher with a C compiler at the first launch, which can fail), three
    times: through the normal launch, :func:`launch`'s check and its cached fast path."""
    try:
        # Three rounds: the first launch per kernel compiles, the second is launch()'s
        # check, the third its direct (cached) launch: all three must give these results.
        for _ in range(3):
            t = torch.zeros(4, 8, device=device)
            idx = torch.tensor([1, 1, 3], device=device)
            scatter_add_rows(t, idx, torch.ones(3, 8, device=device), 2.0, backend="triton")
            want = torch.tensor([0.0, 4.0, 0.0, 2.0], device=device)[:, None].expand(4, 8)
            ok = torch.equal(t, want)
            ok &= torch.equal(take_rows(t, idx, backend="triton"), t.index_select(0, idx))
            dst = put_rows(torch.zeros(4, 8, device=device), idx[1:], t[:2], backend="triton")
            ok &= torch.equal(dst, torch.zeros(4, 8, device=device).index_copy_(0, idx[1:], t[:2]))
            pos = torch.zeros(4, dtype=torch.int32, device=device)
            flag = torch.zeros(1, dtype=torch.int32, device=device)
            cnt = torch.zeros(2, dtype=torch.int64, device=device)
            ids = torch.tensor([1, 3, 1, 9], device=device)  # 9: out of range, flagged
            slots = mark_local(ids, pos, flag, cnt[:1], 4, backend="triton")
            ok &= int(flag) > 0
            rows, _ = take_local(t, slots, pos, flag, cnt[:1], cnt[1:], backend="triton")
            ok &= torch.equal(rows, t.index_select(0, ids.clamp(0, 3))) and int(cnt[0]) == 2
            ok &= prep_trial(device)  # (the batch plan's kernels)
            if not ok:
                return "wrong result in a trial launch"
    except Exception as e:  # noqa: BLE001 - any failure means "do not use it"
        return f"{type(e).__name__}: {e}"
    return None


def scatter_add_rows_reference(
    table: torch.Tensor, idx: torch.Tensor, src: torch.Tensor, alpha: float = 1.0
) -> torch.Tensor:
    """``table[idx[i]] += alpha * src[i]`` for every ``i`` (repeats add up): torch's
    ``index_add_`` through :func:`hetgmp.embedding.ops.index_add_rows` (which skips an empty
    ``idx``)."""
    return index_add_rows(table, idx, src.to(table.dtype), alpha)


def scatter_add_rows(
    table: torch.Tensor,
    idx: torch.Tensor,
    src: torch.Tensor,
    alpha: float = 1.0,
    *,
    backend: str = "torch",
    fields: int | None = None,
    part: tuple[torch.Tensor, int] | None = None,
) -> torch.Tensor:
    """``table[idx[i]] += alpha * src[i]`` (``table [R, D]`` float32 contiguous, ``idx [n]``
    int32/int64 in range, ``src [n, D]``) with the given backend (see :func:`resolve`). The
    Triton kernel skips a negative index (padding entries: no atomics on a shared dummy row);
    the torch reference needs every index in range. ``idx`` and ``src`` may also come in any
    shapes ``[...]`` and ``[..., D]`` of ``n`` and ``n * D`` elements (the one-rank step passes
    its ``[B, F]`` slots and ``[B, F, D]`` gradient: no reshape op on the Triton path). ``src``
    may be bf16 / fp16 (an autocast gradient): it is added in float32, without a cast copy.
    ``fields``: ``idx`` is a batch's ``[B, fields]`` occurrences (any layout of ``n``): the
    Triton path then sums each field's repeated rows in registers first (:data:`FIELD_RUNS`).
    ``part``: ``(edge, 1)`` adds only the occurrences of rows below ``edge`` (a one-element
    integer tensor, read on the device), ``(edge, 2)`` only those at or above it (a sum split
    in two passes over the same occurrences: each row's adds are the whole sum's)."""
    if backend == "torch" or idx.numel() == 0:
        if idx.dim() != 1:
            idx = idx.reshape(-1)
        if src.dim() != 2:
            src = src.reshape(-1, src.shape[-1])
        if part is not None and idx.numel():
            edge, which = part
            sel = (idx < edge) if which == 1 else (idx >= edge)
            idx, src = idx[sel], src[sel]
        return scatter_add_rows_reference(table, idx, src, alpha)
    k = _kernels()
    triton, kernel = k.triton, k.scatter
    n, d = idx.numel(), src.shape[-1]
    if (
        table.dim() != 2 or table.shape[1] != d or table.dtype != torch.float32
        or src.numel() != n * d
    ):  # fmt: skip
        raise ValueError(
            f"table {tuple(table.shape)} {table.dtype} vs src {tuple(src.shape)}, idx {n}"
        )
    if not table.is_contiguous():
        raise ValueError("scatter_add_rows needs a contiguous table")
    if src.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        src = src.to(torch.float32)
    src = src.contiguous()
    idx = idx.contiguous()
    edge, which = part if part is not None else (idx, 0)  # (PART 0: the pointer unread)
    runs = FIELD_RUNS and (FIELD_RUNS_INTERPRETED or not interpreted())
    if runs and fields and n % fields == 0:
        return _scatter_add_fields(k, table, idx, src, float(alpha), fields, edge, which)
    block_r, block_d = row_tiles(triton, d)
    grid = (triton.cdiv(n, block_r),)
    with on_device(table):
        consts = {"D": d, "BLOCK_R": block_r, "BLOCK_D": block_d, "PART": which}
        launch(kernel, grid, (table, idx, src, n, float(alpha), edge), consts)
    return table


# scatter_add_rows with ``fields``: one atomic per run of a row among FIELD_SAMPLES samples of a
# field (scatter_add_fields_kernel) instead of one per occurrence (False: the plain kernel).
FIELD_RUNS = True
FIELD_SAMPLES = 64
# Also in Triton's interpreter (CPU tests). Off there: its sort and scan run as numpy calls per
# program and doubled the training tests' time; tests/test_scatter_fields.py turns it on and
# checks the kernel against the reference, and the GPU checks train with it.
FIELD_RUNS_INTERPRETED = False


def _scatter_add_fields(
    k: Any, table: torch.Tensor, idx: torch.Tensor, src: torch.Tensor, alpha: float, f: int,
    edge: torch.Tensor, which: int,
) -> torch.Tensor:  # fmt: skip
    d, bs = src.shape[-1], FIELD_SAMPLES
    b_rows = idx.numel() // f
    grid = (k.triton.cdiv(b_rows, bs), f)
    with on_device(table):
        consts = {"F": f, "D": d, "BS": bs, "LB": bs.bit_length() - 1,
                  "BLOCK_D": min(k.triton.next_power_of_2(d), 64), "PART": which}  # fmt: skip
        launch(k.scatter_fields, grid, (table, idx, src, b_rows, alpha, edge), consts)
    return table


def take_rows_reference(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``table.index_select(0, idx)``."""
    return table.index_select(0, idx)


def take_rows(
    table: torch.Tensor,
    idx: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    backend: str = "torch",
    out_dtype: torch.dtype | None = None,
    skip_negative: bool = False,
) -> torch.Tensor:
    """``out[i] = table[idx[i]]`` (``table [R, D]`` contiguous, ``idx [n]`` int32/int64 in
    range; ``out [n, D]`` contiguous, allocated when not given; ``skip_negative`` with ``out``:
    a negative ``idx[i]`` leaves ``out[i]`` unchanged and reads no row, e.g. a padded list of
    rows in host memory). Why a kernel: torch's
    ``index_select`` moved rows at ~1.7 TB/s on an H200 for a Criteo batch (1.03 ms for 1.7M
    rows of 512 bytes, kernels_H200.md), well under the copy bandwidth; whole-row tiles with one
    64-bit offset per row need no per-element index math (0.31 ms). ``out_dtype`` (when ``out``
    is not given; default the table's): the rows' dtype, e.g. bf16 under autocast, converted
    in the kernel (no separate cast pass over the ``[n, D]`` rows)."""
    n = idx.numel()
    dtype = table.dtype if out_dtype is None or out is not None else out_dtype
    if skip_negative:
        if out is None:
            raise ValueError("take_rows(skip_negative=True) needs out (the rows it leaves)")
        if backend == "torch" or n == 0:
            at = torch.nonzero(idx >= 0).reshape(-1)
            return out.index_copy_(0, at, table.index_select(0, idx.index_select(0, at)))
    if backend == "torch" or n == 0:
        if out is None:
            return take_rows_reference(table, idx).to(dtype)
        return torch.index_select(table, 0, idx, out=out)
    if table.dim() != 2 or not table.is_contiguous():
        raise ValueError(f"take_rows needs a contiguous 2-D table, got {tuple(table.shape)}")
    d = table.shape[1]
    k = _kernels()
    triton, kernel = k.triton, k.take
    if out is None:
        out = torch.empty(n, d, dtype=dtype, device=table.device)
    elif out.shape != (n, d) or not out.is_contiguous() or out.dtype != table.dtype:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} vs ({n}, {d}) {table.dtype}")
    block_r, block_d = row_tiles(triton, d)
    idx = idx.contiguous()
    with on_device(table):
        # (every constexpr, defaults too: the fast launch path checks the full signature)
        consts = {"D": d, "BLOCK_R": block_r, "BLOCK_D": block_d, "SKIP": skip_negative}
        launch(kernel, (triton.cdiv(n, block_r),), (table, idx, out, n), consts)
    return out


def put_rows_reference(dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.index_copy_(0, idx, src)``."""
    return dst.index_copy_(0, idx, src)


def put_rows(
    dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor, *, backend: str = "torch"
) -> torch.Tensor:
    """``dst[idx[i]] = src[i]`` (``dst [R, D]`` and ``src [n, D]`` contiguous, same dtype;
    ``idx [n]`` in range, or negative: skipped, Triton only; where ``idx`` repeats, each element
    gets one of the writers' values: on CUDA not necessarily all from one row). The inverse of
    :func:`take_rows`, and why: in a profile of the padded 2-GPU step on an H200 torch's
    ``index_copy_`` took 0.12 ms for 31k rows of 128 floats (per-element index math); the
    row-tile kernel a few microseconds."""
    n = idx.numel()
    if backend == "torch" or n == 0:
        return put_rows_reference(dst, idx, src)
    if dst.dim() != 2 or not dst.is_contiguous() or src.dtype != dst.dtype:
        raise ValueError(
            f"put_rows needs a contiguous 2-D dst and src of its dtype, got dst "
            f"{tuple(dst.shape)} {dst.dtype}, src {src.dtype}"
        )
    k = _kernels()
    triton, kernel = k.triton, k.put
    d = dst.shape[1]
    if src.shape != (n, d):
        raise ValueError(f"src {tuple(src.shape)} vs ({n}, {d})")
    block_r, block_d = row_tiles(triton, d)
    src, idx = src.contiguous(), idx.contiguous()
    with on_device(dst):
        launch(kernel, (triton.cdiv(n, block_r),), (dst, idx, src, n),
               {"D": d, "BLOCK_R": block_r, "BLOCK_D": block_d})  # fmt: skip
    return dst


class _GatherRows(torch.autograd.Function):
    """``values.index_select(0, inv)`` (:func:`take_rows`); backward: ``zeros_like(values)``
    + scatter-add."""

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, inv: torch.Tensor, backend: str) -> torch.Tensor:
        ctx.save_for_backward(inv)
        ctx.rows, ctx.backend = values.shape[0], backend
        return take_rows(values, inv, backend=backend)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (inv,) = ctx.saved_tensors
        d = grad.shape[-1]
        out = grad.new_zeros(ctx.rows, d, dtype=torch.float32)
        scatter_add_rows(out, inv, grad.reshape(-1, d), 1.0, backend=ctx.backend)
        return out, None, None


def gather_rows(values: torch.Tensor, inv: torch.Tensor, backend: str = "torch") -> torch.Tensor:
    """``values [U, D]`` rows ``inv [n]`` -> ``[n, D]``, differentiable in ``values``; the
    backward adds the gradient of every occurrence into its row with the given backend. (The
    padded exchange has its own node, ``distributed._PaddedLookup``, whose gradient is summed
    inside the next step's CUDA graph.)"""
    return _GatherRows.apply(values, inv, backend)
