"""The fused pooled lookup of multi-hot fields (issue 34): the table's rows of one lookup
``[B * F + E, D]`` (single-hot ids, then every bag value) straight into the model's input
``[B, F + K, D]`` in one pass, and back.

Why: the plain path (:class:`hetgmp.models.pooling.PoolBags` + ``torch.cat``) runs an
``index_add`` into a float32 buffer, a scale, a cast and a ``cat`` forward, and backward a
split of the gradient, an ``index_select`` and the zero-filled slice gradients autograd sums
into the lookup's: five or more passes over ``[B, F + K, D]``-sized data each way. The kernels
(:mod:`hetgmp.models.pooling_triton`) read the lookup's rows once and write the input once,
and backward writes every lookup row's gradient once, in the rows' dtype (bf16 under
autocast), which is what the one-rank table step takes (``LocalStep.grads``: one gradient per
occurrence, summed per row by its update).

Not done, and why: feeding the table the pooled gradient itself (its update reading
``grad[seg[i]] * scale`` per occurrence, never writing the ``[E, D]`` occurrence gradient)
would save one more pass, but needs an indirect gradient in every optimizer path of
:class:`hetgmp.embedding.local.LocalStep` (SGD's scatter, Adagrad's leader sums) and of the
tier; left for when the GPU figure shows the pass matters.

``pool_fields`` dispatches (``backend`` "torch": the reference, torch ops on the same segment
offsets; "triton": the kernels); :func:`resolve_pooling` maps ``--kernels`` to a backend as
the row kernels do (:func:`hetgmp.embedding.kernels.resolve`).
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from hetgmp.choices import KERNELS
from hetgmp.embedding.kernels.launcher import interpreted, launch, on_device, row_tiles


@functools.lru_cache(maxsize=1)
def _triton() -> Any:
    """The kernel module, or why it does not import."""
    try:
        return importlib.import_module("hetgmp.models.pooling_triton")
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        return f"{type(e).__name__}: {e}"


def _kernels() -> Any:
    got = _triton()
    if isinstance(got, str):
        raise RuntimeError(f"Triton pooling kernels unavailable: {got}")
    return got


def segment_offsets(present: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """``off [B * K + 1]`` (int64): bag ``s = b * K + k``'s values are the lookup's bag values
    ``off[s] .. off[s + 1]`` (``present [B, W]``: the non-padding slots of each field's padded
    columns, in order; ``ends [K]``: each field's last column). Device ops only, no host sync."""
    b = present.shape[0]
    upto = present.to(torch.int64).cumsum(1).index_select(1, ends)  # [B, K]: through field k
    counts = torch.diff(upto, dim=1, prepend=upto.new_zeros(b, 1))
    off = torch.zeros(b * ends.numel() + 1, dtype=torch.int64, device=present.device)
    torch.cumsum(counts.reshape(-1), 0, out=off[1:])
    return off


def pool_fields_reference(
    rows: torch.Tensor, off: torch.Tensor, mean: torch.Tensor, b: int, f: int
) -> torch.Tensor:
    """``[B, F + K, D]`` of the lookup's rows ``[B * F + E, D]`` in torch ops (float32 sums,
    as the kernel; differentiable): single-hot rows as they are, bag ``s``'s rows summed
    (``mean [K]`` bool: divided by the bag's length, at least 1). Rows past the bags' values
    (a compact lookup's tail: ``[B * F + C, D]`` with ``C >= E``) belong to no bag: their
    gradient is zero. No host sync (each value's bag found by a search of ``off``)."""
    k, d = mean.numel(), rows.shape[1]
    counts = torch.diff(off)
    bags = rows[b * f :].float()
    pos = torch.arange(bags.shape[0], device=rows.device)
    seg = torch.searchsorted(off[1:], pos, right=True)  # (a tail row: b * k, dropped below)
    pooled = bags.new_zeros(b * k + 1, d).index_add(0, seg, bags)[: b * k]
    scale = torch.where(mean.repeat(b), 1.0 / counts.clamp(min=1).float(), 1.0)
    pooled = (pooled * scale.unsqueeze(1)).to(rows.dtype)
    return torch.cat([rows[: b * f].reshape(b, f, d), pooled.reshape(b, k, d)], dim=1)


def _zero_tail(out: torch.Tensor, off: torch.Tensor, b: int, f: int) -> None:
    """A compact lookup's gradient ``out [B * F + C, D]``: its rows past the bags' values
    zeroed (no host read of where they start)."""
    mod = _kernels()
    d, tail = out.shape[-1], out.shape[0] - b * f
    block_r, block_d = row_tiles(mod.triton, d)
    grid = (max(1, mod.triton.cdiv(tail, block_r)), mod.triton.cdiv(d, block_d))
    with on_device(out):
        launch(mod.zero_tail_kernel, grid, (out, off, b * f, out.shape[0], off.numel() - 1),
               {"D": d, "BLOCK_R": block_r, "BLOCK_D": block_d})  # fmt: skip


def _launch(which: str, src: torch.Tensor, off: torch.Tensor, mean: torch.Tensor,
            out: torch.Tensor, b: int, f: int, k: int) -> None:  # fmt: skip
    """One of the kernels over the ``b * (f + k)`` output rows."""
    mod = _kernels()
    kernel = mod.pool_fwd_kernel if which == "fwd" else mod.pool_bwd_kernel
    d = src.shape[-1]
    block_r, block_d = row_tiles(mod.triton, d)
    block_r = min(block_r, 64)  # (each row loops over its bag: fewer rows, less waiting)
    p = b * (f + k)
    grid = (max(1, mod.triton.cdiv(p, block_r)), mod.triton.cdiv(d, block_d))
    with on_device(src):
        launch(kernel, grid, (src, off, mean, out, p, b, f, k),
               {"D": d, "BLOCK_R": block_r, "BLOCK_D": block_d})  # fmt: skip


class _FusedPool(torch.autograd.Function):
    """:func:`pool_fields_reference` as the two kernels."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, off: torch.Tensor, mean: torch.Tensor, b: int,
                f: int, tail: bool) -> torch.Tensor:  # fmt: skip
        k, d = mean.numel(), rows.shape[1]
        ctx.save_for_backward(off, mean)
        ctx.shape, ctx.dims, ctx.tail = rows.shape, (b, f, k), tail
        rows = rows.contiguous()
        out = torch.empty(b, f + k, d, dtype=rows.dtype, device=rows.device)
        if out.numel():
            _launch("fwd", rows, off, mean, out, b, f, k)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None, None]:
        off, mean = ctx.saved_tensors
        b, f, k = ctx.dims
        # (in the gradient's dtype: autocast's bf16 gradient stays bf16, as the reference's)
        out = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)
        if out.numel():
            _launch("bwd", grad.contiguous(), off, mean, out, b, f, k)
            if ctx.tail and out.shape[0] > b * f:
                _zero_tail(out, off, b, f)
        return out, None, None, None, None, None


def pool_fields(
    rows: torch.Tensor, off: torch.Tensor, mean: torch.Tensor, b: int, f: int, *, backend: str,
    tail: bool = False,
) -> torch.Tensor:  # fmt: skip
    """The model's input ``[B, F + K, D]`` from the lookup's rows ``[B * F + E, D]``
    (contiguous), the bags' offsets ``off [B * K + 1]`` (:func:`segment_offsets`) and the
    fields pooled by mean (``mean [K]`` bool), with ``backend`` "torch" or "triton".
    ``tail``: the rows are a compact lookup's ``[B * F + C, D]`` (``C >= E``), the rows past
    the bags' values padding whose gradient is zero."""
    if backend == "torch":
        return pool_fields_reference(rows, off, mean, b, f)
    return _FusedPool.apply(rows, off, mean.to(torch.int32), b, f, tail)


def resolve_pooling(kernels: str, device: torch.device) -> str:
    """The pooling backend ``--kernels`` means on ``device`` (the row kernels' policy):
    "torch" is torch; "triton" is Triton or an error; "auto" is torch off CUDA and Triton on
    CUDA when it imports and passes a trial run against the reference, else torch with a
    warning (never a silent fallback)."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
    if kernels == "torch" or (kernels == "auto" and device.type != "cuda"):
        return "torch"
    if device.type != "cuda" and not interpreted():
        raise ValueError(
            f"kernels='triton' needs CUDA tensors (got {device}); use 'auto' or 'torch'"
        )
    why = _triton() if isinstance(_triton(), str) else _trial(device)
    if why is None:
        return "triton"
    if kernels == "triton":
        raise RuntimeError(f"kernels='triton': the pooling kernels do not run here: {why}")
    warnings.warn(f"Triton pooling kernels do not run here ({why}); using torch's", stacklevel=2)
    return "torch"


@functools.cache
def _trial(device: torch.device) -> str | None:
    """Forward and backward on a small lookup of ``device`` (twice: the first launch compiles,
    the second takes the cached launcher), against the reference."""
    try:
        present = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 1], [1, 1, 1, 0]], device=device) > 0
        off = segment_offsets(present, torch.tensor([2, 3], device=device))
        mean = torch.tensor([False, True], device=device)
        g = torch.Generator().manual_seed(0)
        rows = torch.randn(3 * 2 + int(present.sum()), 8, generator=g).to(device)
        grad = torch.randn(3, 4, 8, generator=g).to(device)
        want: list[torch.Tensor] = []
        for backend in ("torch", "triton", "triton"):
            r = rows.clone().requires_grad_()
            out = pool_fields(r, off, mean, 3, 2, backend=backend)
            out.backward(grad)
            assert r.grad is not None
            got = [out.detach(), r.grad]
            if backend == "torch":
                want = got
            elif not all(torch.allclose(a, w, atol=1e-5) for a, w in zip(got, want, strict=True)):
                return "wrong result in a trial run"
    except Exception as e:  # noqa: BLE001 - any failure means "do not use it"
        return f"{type(e).__name__}: {e}"
    return None
