"""DCN's cross network fused with its output projection: ``y = x_L . u`` per row, where
``x_{l+1} = x_0 * (x_l . w_l) + b_l + x_l`` (:class:`hetgmp.models.layers.CrossNetwork`) and
``u`` is the output layer's cross columns. :func:`cross_logit` dispatches to the torch reference
(:func:`cross_logit_reference`, the layers one by one) or to the Triton kernels
(:mod:`hetgmp.models.cross_triton`).

Why one pass is enough. By induction ``x_l = x_0 * a_l + c_l`` with a per-row scalar ``a_l``
(``a_0 = 1``) and a per-column vector ``c_l = b_0 + ... + b_{l-1}``: ``s_l = x_l . w_l = a_l p_l +
q_l`` with ``p_l = x_0 . w_l`` and ``q_l = c_l . w_l``, and ``a_{l+1} = a_l + s_l``; finally
``y = a_L (x_0 . u) + c_L . u``. So the forward needs only the ``L + 1`` dots ``P = x_0 @ [w; u]^T``
(one read of ``x_0``, in its own dtype, float32 sums), the per-row recurrence, and the weight-only
``q`` (computed here with torch ops, so autograd takes their gradient to the biases). The
backward turns ``dy`` into ``dP`` and ``dq`` per row (a recurrence on saved ``P``), then
``dx_0 = dP @ [w; u]`` (one read of ``x_0``, one write of ``dx_0``) and ``d[w; u] = dP^T x_0``, a
reduction over the batch done in two stages (per-program partials over row groups, then one
``sum`` over the groups): deterministic, unlike atomics, for the price of a few MB of partials.
No ``[B, K]`` intermediate is written: the layer-by-layer way writes ``x_1 .. x_L`` and their
gradients, the concatenated input and ``x_L``'s projection gradient.

The inputs stay in two pieces (flat embeddings ``[B, F*D]`` and dense features ``[B, n]``),
never concatenated. Everything is CUDA-graph capturable: no host sync, shapes only.
"""

from __future__ import annotations

import functools
import importlib
import os
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from hetgmp.choices import KERNELS


class Tiles(NamedTuple):
    """Kernel tile sizes: forward rows per program and columns per step; backward rows per
    step and columns per program; ``programs``: about how many backward programs to start
    (fewer row groups = smaller partials; more = more parallelism)."""

    fwd_rows: int = 16
    fwd_cols: int = 256
    bwd_rows: int = 16
    bwd_cols: int = 128
    programs: int = 2048


TILES = Tiles()  # float32 rows
# bf16 rows: taller backward tiles over fewer columns, more programs (fastest of the sweep on an
# H200 at batch 8192 and 65536, bench/gpu/dcn_cross.py --sweep, 2026-11-25)
BF16_TILES = Tiles(16, 256, 32, 64, 4096)


def default_tiles(dtype: torch.dtype) -> Tiles:
    """The tiles :func:`cross_logit` uses for rows of ``dtype`` unless told otherwise."""
    return TILES if dtype == torch.float32 else BF16_TILES


@functools.lru_cache(maxsize=1)
def _triton() -> Any:
    """The kernel module, or why it does not import."""
    try:
        return importlib.import_module("hetgmp.models.cross_triton")
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        return f"{type(e).__name__}: {e}"


def _kernels() -> Any:
    got = _triton()
    if isinstance(got, str):
        raise RuntimeError(f"Triton cross kernels unavailable: {got}")
    return got


def cross_logit_reference(
    xa: torch.Tensor,
    xb: torch.Tensor | None,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor],
    u: torch.Tensor,
) -> torch.Tensor:
    """The layers one by one in float32 (what DCN computes with ``--kernels torch``) -> ``[B]``."""
    x0 = xa if xb is None else torch.cat([xa, xb.to(xa.dtype)], dim=1)
    x0 = x0.to(torch.promote_types(x0.dtype, torch.float32))
    x = x0
    for w, b in zip(weights, biases, strict=True):
        x = x0 * (x @ w).unsqueeze(1) + b + x
    return F.linear(x, u.reshape(1, -1)).squeeze(1)


def _weight_terms(
    weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor], u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``wcat = [w_0; ..; w_{L-1}; u]`` and ``q = (c_l . w_l for l < L, c_L . u)`` (at least
    float32), differentiable (autograd carries ``dq`` to the biases)."""
    wcat = torch.stack([*weights, u.reshape(-1)])
    wcat = wcat.to(torch.promote_types(wcat.dtype, torch.float32))  # (float32, float64 kept)
    b = torch.stack(list(biases)).to(wcat.dtype)
    c = torch.cat([b.new_zeros(1, b.shape[1]), b.cumsum(0)])  # c_0 = 0, .., c_L = sum b
    return wcat.contiguous(), (c * wcat).sum(1)


def _check(xa: torch.Tensor, xb: torch.Tensor | None, width: int) -> None:
    if xa.dim() != 2 or (xb is not None and (xb.dim() != 2 or xb.shape[0] != xa.shape[0])):
        raise ValueError(
            f"cross network inputs must be [B, Ka] and [B, Kb], got {tuple(xa.shape)} and "
            f"{None if xb is None else tuple(xb.shape)}"
        )
    got = xa.shape[1] + (0 if xb is None else xb.shape[1])
    if got != width:
        raise ValueError(f"cross network of width {width} got inputs {got} wide")


def cross_logit(
    xa: torch.Tensor,
    xb: torch.Tensor | None,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor],
    u: torch.Tensor,
    backend: str = "torch",
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """``x_L . u`` for every row of the input ``[xa, xb]`` (``xb``: optional dense columns, taken
    in ``xa``'s dtype), as float32 ``[B]``; ``backend`` "torch" (:func:`cross_logit_reference`)
    or "triton" (``tiles``: :func:`default_tiles` of ``xa``'s dtype unless given). Float32 sums
    whatever ``xa``'s dtype; ``xa``'s gradient comes in its dtype."""
    _check(xa, xb, u.numel())
    if backend == "torch":
        return cross_logit_reference(xa, xb, weights, biases, u)
    if backend != "triton":
        raise ValueError(f"cross network backend must be 'torch' or 'triton', got {backend!r}")
    with torch.autocast(xa.device.type, enabled=False):
        wcat, q = (t.float() for t in _weight_terms(weights, biases, u))  # (the kernels' dtype)
        # the dense columns in the rows' dtype, as flat_inputs (and so the reference) has them
        xb = xa.new_empty(xa.shape[0], 0) if xb is None else xb.to(xa.dtype)
        tiles = tiles or default_tiles(xa.dtype)
        return _CrossLogit.apply(_rows(xa), _rows(xb), wcat, q, tiles)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` with unit column stride (what the kernels index)."""
    return x if x.stride(1) == 1 or x.shape[1] <= 1 else x.contiguous()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _lp(n: int) -> int:
    return 1 << (n - 1).bit_length()


class _CrossLogit(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, xa, xb, wcat, q, tiles: Tiles):
        k = _kernels()
        b, ka, kb = xa.shape[0], xa.shape[1], xb.shape[1]
        nl, lp = wcat.shape[0], _lp(wcat.shape[0])
        y = torch.empty(b, dtype=torch.float32, device=xa.device)
        p = torch.empty(b, lp, dtype=torch.float32, device=xa.device)
        if b:
            xb_ = xb if kb else xa  # (a stand-in pointer, never read with Kb = 0)
            args = (xa, xb_, wcat, q, y, p, b, ka, kb, xa.stride(0), max(1, xb.stride(0)),
                    wcat.stride(0))  # fmt: skip
            consts = {"L": nl - 1, "LP": lp, "BLOCK_B": tiles.fwd_rows, "BLOCK_K": tiles.fwd_cols}
            _launch(k.cross_fwd_kernel, (_cdiv(b, tiles.fwd_rows),), args, consts)
        ctx.save_for_backward(xa, xb, wcat, q, p)
        ctx.tiles = tiles
        return y

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor):
        xa, xb, wcat, q, p = ctx.saved_tensors
        return (*_backward(xa, xb, wcat, q, p, gy, ctx.tiles), None)


def _backward(xa, xb, wcat, q, p, gy, tiles: Tiles) -> tuple[torch.Tensor, ...]:  # noqa: ANN001
    """``dxa, dxb, dwcat, dq`` through the backward kernel and the sums over row groups."""
    k = _kernels()
    b, ka, kb = xa.shape[0], xa.shape[1], xb.shape[1]
    nl, lp = wcat.shape[0], _lp(wcat.shape[0])
    gxa, gxb = torch.empty_like(xa), torch.empty_like(xb)
    if b == 0:
        return gxa, gxb, torch.zeros_like(wcat), torch.zeros_like(q)
    bb, bk = tiles.bwd_rows, tiles.bwd_cols
    chunks = _cdiv(ka, bk) + _cdiv(kb, bk)
    groups = min(_cdiv(b, bb), max(1, tiles.programs // chunks))
    per_group = _cdiv(_cdiv(b, groups), bb) * bb  # rows per group, a multiple of bb
    groups = _cdiv(b, per_group)
    part = torch.empty(groups, lp, ka + kb, dtype=torch.float32, device=xa.device)
    gq = torch.empty(groups, lp, dtype=torch.float32, device=xa.device)  # (all written)
    gy = gy.contiguous().float()
    xb_, gxb_ = (xb, gxb) if kb else (xa, gxa)  # (stand-ins, never read with Kb = 0)
    args = (xa, xb_, gxa, gxb_, wcat, q, p, gy, part, gq, b, ka, kb, xa.stride(0),
            max(1, xb.stride(0)), gxa.stride(0), max(1, gxb.stride(0)), wcat.stride(0),
            per_group)  # fmt: skip
    consts = {"L": nl - 1, "LP": lp, "BLOCK_B": bb, "BLOCK_K": bk}
    _launch(k.cross_bwd_kernel, (groups, chunks), args, consts)
    return gxa, gxb, part.sum(0)[:nl], gq.sum(0)[:nl]


def _launch(kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], consts: dict) -> None:
    """Through the row kernels' cached launcher (less host time per launch), on ``args[0]``'s
    device."""
    from hetgmp.embedding.kernels.launcher import launch, on_device

    with on_device(args[0]):
        launch(kernel, grid, args, consts)


def resolve_cross(kernels: str, device: torch.device) -> str:
    """The cross network backend that ``--kernels`` means on ``device`` (the row kernels'
    policy, :func:`hetgmp.embedding.kernels.resolve`): "torch" is torch; "triton" is Triton or
    an error; "auto" is torch off CUDA and Triton on CUDA when it imports and passes a trial
    run against the reference, else torch with a warning (never a silent fallback)."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
    if kernels == "torch":
        return "torch"
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if kernels == "auto" and device.type != "cuda":
        return "torch"
    if device.type != "cuda" and not interpreted:
        raise ValueError(
            f"kernels='triton' needs CUDA tensors (got {device}); use 'auto' or 'torch'"
        )
    why = _triton() if isinstance(_triton(), str) else _trial(device)
    if why is None:
        return "triton"
    if kernels == "triton":
        raise RuntimeError(f"kernels='triton': the DCN cross kernels do not run here: {why}")
    warnings.warn(f"Triton DCN cross kernels do not run here ({why}); using torch's", stacklevel=2)
    return "torch"


@functools.cache
def _trial(device: torch.device) -> str | None:
    """Compile and run forward + backward on a small input of ``device`` (twice: the first
    launch compiles, the second takes the cached launcher) and compare with the reference in
    float64 (a float32 reference may run its products in TF32 on CUDA)."""
    try:
        g = torch.Generator().manual_seed(0)
        xa, xb = torch.randn(37, 70, generator=g), torch.randn(37, 3, generator=g)
        ws = [torch.randn(73, generator=g) * 0.1 for _ in range(3)]
        bs = [torch.randn(73, generator=g) * 0.1 for _ in range(3)]
        u = torch.randn(73, generator=g)
        f32, f64 = torch.float32, torch.float64
        for dtype, backend in ((f64, "torch"), (f32, "triton"), (f32, "triton")):
            ts = [t.to(device, dtype, copy=True).requires_grad_() for t in (xa, xb, *ws, *bs, u)]
            tiles = Tiles(8, 32, 8, 32, 8)
            y = cross_logit(ts[0], ts[1], ts[2:5], ts[5:8], ts[8], backend, tiles)
            y.pow(2).sum().backward()
            got = [y.detach()]
            for t in ts:
                if t.grad is None:  # (every input takes part in the result)
                    return "no gradient in a trial run"
                got.append(t.grad)
            if backend == "torch":
                want = got
            elif not all(_near(a, b) for a, b in zip(got, want, strict=True)):
                return "wrong result in a trial run"
    except Exception as e:  # noqa: BLE001 - any failure means "do not use it"
        return f"{type(e).__name__}: {e}"
    return None


def _near(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-4) -> bool:
    """Within ``rtol`` of ``want``'s largest magnitude (at least 1)."""
    scale = max(1.0, float(want.abs().max()))
    return float((got.double() - want).abs().max()) <= rtol * scale
