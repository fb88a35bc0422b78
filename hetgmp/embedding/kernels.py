"""Fused GPU kernels of the embedding runtime, each next to the plain-torch reference it must match.

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
uses so callers can log it. ``"auto"`` also compiles and runs the kernel once on the device
and falls back to torch with a warning if that fails; an explicit ``"triton"`` raises instead. Set ``TRITON_INTERPRET=1`` to run the Triton kernel on CPU tensors (slow; tests).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from hetgmp.embedding.ops import index_add_rows

KERNELS = ("auto", "torch", "triton")


@functools.lru_cache(maxsize=1)
def _triton() -> Any:
    """The compiled Triton kernel, or the ImportError text if Triton is unusable."""
    try:
        import triton
        import triton.language as tl
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        return f"{type(e).__name__}: {e}"

    @triton.jit
    def scatter_add_rows_kernel(
        table_ptr,
        idx_ptr,
        src_ptr,
        n,
        alpha,
        D: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        pid = tl.program_id(0)
        rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < n
        idx = tl.load(idx_ptr + rows, mask=rmask, other=0).to(tl.int64)
        src_row = rows.to(tl.int64) * D
        dst_row = idx * D
        for d0 in tl.static_range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            m = rmask[:, None] & (cols < D)[None, :]
            g = tl.load(src_ptr + src_row[:, None] + cols[None, :], mask=m, other=0.0)
            tl.atomic_add(
                table_ptr + dst_row[:, None] + cols[None, :], g * alpha, mask=m, sem="relaxed"
            )

    return triton, scatter_add_rows_kernel


def triton_available() -> str | None:
    """``None`` if the Triton kernels can run, else why not."""
    got = _triton()
    return got if isinstance(got, str) else None


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
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"kernels='triton' needs CUDA tensors (got {device}); use 'auto' or 'torch'"
        )
    if why is not None:
        raise RuntimeError(f"kernels='triton' was asked for but Triton does not import: {why}")
    return "triton"


@functools.cache
def _trial_launch(device: torch.device) -> str | None:
    """Compile and run the kernel once on a tiny table of ``device`` and check the result
    (Triton builds its launcher with a C compiler at the first launch, which can fail)."""
    try:
        t = torch.zeros(4, 8, device=device)
        idx = torch.tensor([1, 1, 3], device=device)
        scatter_add_rows(t, idx, torch.ones(3, 8, device=device), 2.0, backend="triton")
        want = torch.tensor([0.0, 4.0, 0.0, 2.0], device=device)[:, None].expand(4, 8)
        if not torch.equal(t, want):
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
    return index_add_rows(table, idx, src, alpha)


def scatter_add_rows(
    table: torch.Tensor,
    idx: torch.Tensor,
    src: torch.Tensor,
    alpha: float = 1.0,
    *,
    backend: str = "torch",
) -> torch.Tensor:
    """``table[idx[i]] += alpha * src[i]`` (``table [R, D]`` float32 contiguous, ``idx [n]``
    int32/int64 in range, ``src [n, D]``) with the given backend (see :func:`resolve`)."""
    if backend == "torch" or idx.numel() == 0:
        return scatter_add_rows_reference(table, idx, src, alpha)
    got = _triton()
    if isinstance(got, str):
        raise RuntimeError(f"Triton kernels unavailable: {got}")
    triton, kernel = got
    n, d = src.shape
    if table.dim() != 2 or table.shape[1] != d or table.dtype != torch.float32:
        raise ValueError(f"table {tuple(table.shape)} {table.dtype} vs src {tuple(src.shape)}")
    if not table.is_contiguous():
        raise ValueError("scatter_add_rows needs a contiguous table")
    src = src.to(torch.float32).contiguous()
    idx = idx.contiguous()
    block_d = min(triton.next_power_of_2(d), 128)
    block_r = max(1, 4096 // block_d)  # a 4096-element tile per program
    grid = (triton.cdiv(n, block_r),)
    # Triton launches on torch's current device: make it the table's
    on_device = (
        torch.cuda.device(table.device)
        if table.is_cuda and table.device.index != torch.cuda.current_device()
        else contextlib.nullcontext()
    )
    with on_device:
        kernel[grid](table, idx, src, n, float(alpha), D=d, BLOCK_R=block_r, BLOCK_D=block_d)
    return table


class _GatherRows(torch.autograd.Function):
    """``values.index_select(0, inv)``; backward: ``zeros_like(values)`` + scatter-add."""

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, inv: torch.Tensor, backend: str) -> torch.Tensor:
        ctx.save_for_backward(inv)
        ctx.rows, ctx.backend = values.shape[0], backend
        return values.index_select(0, inv)

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
    backward adds the gradient of every occurrence into its row with the given backend."""
    return _GatherRows.apply(values, inv, backend)
