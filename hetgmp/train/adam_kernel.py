"""One Adam step over flat buffers as a single Triton kernel (CUDA), next to its reference.

Why: :class:`~hetgmp.train.flat_adam.FlatAdam`'s torch ops make seven passes over WDL-128's
~1M dense parameters (a lerp, a multiply, an addcmul, a square root, two divisions, an addcdiv:
about 25 us of a 0.6 ms batch-8192 step on an H100); one kernel reads the parameters, the
gradient and both moments once and writes three of them back. The reference is the torch ops
(``FlatAdam`` with ``fused=False``); they agree to float rounding (tests/test_flat_adam.py runs
the kernel in Triton's interpreter on CPU).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from hetgmp.embedding.kernels.launcher import launch, on_device, triton_available

BLOCK = 2048  # elements per program (1M parameters: ~500 programs over the whole chip)


@functools.lru_cache(maxsize=2)
def _kernel(name: str = "adam_flat_kernel") -> Any:
    from hetgmp.train import adam_triton

    return getattr(adam_triton, name)


def fused_adam_available(device: torch.device, fused: str) -> bool:
    """Whether :func:`adam_flat_step` runs for ``fused`` (``auto``: on CUDA when Triton
    imports; ``triton``: required, else an error saying why; ``torch``: never)."""
    if fused not in ("auto", "triton", "torch"):
        raise ValueError(f"fused must be auto, triton or torch, got {fused!r}")
    if fused == "torch":
        return False
    why = triton_available()
    if fused == "triton" and why is not None:
        raise RuntimeError(f"fused Adam needs Triton: {why}")
    return why is None and (device.type == "cuda" or fused == "triton")


def adam_flat_step(
    p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: torch.Tensor,
    *, lr: float, b1: float, b2: float, eps: float,
) -> None:  # fmt: skip
    """Adam on flat float32 buffers ``p`` (parameters), ``g`` (gradients), ``m``, ``v``
    (moments) with the step count ``step`` (a device scalar, already incremented)."""
    n = p.numel()
    if n == 0:
        return
    grid = ((n + BLOCK - 1) // BLOCK,)
    with on_device(p):
        launch(
            _kernel(), grid, (p, g, m, v, step, n, float(lr), float(b1), float(b2), float(eps)),
            {"BLOCK": BLOCK},
        )  # fmt: skip


def adam_peer_step(
    p: torch.Tensor, gptrs: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: torch.Tensor,
    *, lr: float, b1: float, b2: float, eps: float,
) -> None:  # fmt: skip
    """:func:`adam_flat_step` whose gradient is the sum, in rank order, of every rank's
    gradient buffer in peer memory (``gptrs``: their addresses, int64 ``[world]``, on this
    rank's device; :class:`hetgmp.comm.peer_allreduce.PeerAllReduce`): the dense all-reduce
    and Adam in one pass. Every rank's buffer must be complete before (a barrier) and stay
    unchanged until every rank has run it (a barrier)."""
    n = p.numel()
    if n == 0:
        return
    grid = ((n + BLOCK - 1) // BLOCK,)
    args = (p, gptrs, m, v, step, n, float(lr), float(b1), float(b2), float(eps))
    with on_device(p):
        launch(_kernel("adam_peer_kernel"), grid, args, {"W": int(gptrs.numel()), "BLOCK": BLOCK})
