"""Row-wise Adagrad on a table's rows as one kernel, next to its torch reference.

``adagrad_rows(weight, state, idx, grad, lr, eps, keep=None, lead=None, skip=None)``: for
every selected entry ``i`` (all; those with ``keep[i]``; those with ``lead[i] == i``, the leader
occurrence of each row; or, ``skip=(marks, slot)``, those with ``marks[i] == 0`` and
``idx[i] != slot``: the mask made in the kernel, not by three elementwise launches),
``s = state[idx[i]] + mean(grad[i] ** 2)``, ``state[idx[i]] = s``,
``weight[idx[i]] -= lr * grad[i] / (sqrt(s) + eps)``. Selected entries must be distinct rows.

Why a kernel: the torch sequence (an ``index_add_`` of the squared means, an ``index_select``,
the step's elementwise ops over ``[n, D]`` and a scatter-add) reads the gradient three times and
launches about eight kernels; this reads it twice (the row's mean, then the step) in one launch.
The one-rank step with the CLI's default optimizer runs it every step.
"""

from __future__ import annotations

import torch

from hetgmp.embedding.kernels.launcher import _kernels, launch, on_device, row_tiles
from hetgmp.embedding.ops import index_add_rows

Versions = tuple[torch.Tensor, torch.Tensor]  # (a table's versions [R], counts [n]) int64
Skip = tuple[torch.Tensor, int]  # (marks [n] int64: nonzero skips the entry, a slot skipped)


def adagrad_rows_reference(
    weight: torch.Tensor, state: torch.Tensor, idx: torch.Tensor, grad: torch.Tensor,
    lr: float, eps: float, *, keep: torch.Tensor | None = None, lead: torch.Tensor | None = None,
    versions: Versions | None = None,
) -> None:  # fmt: skip
    """:func:`adagrad_rows` in torch ops."""
    sel = _selected(idx, keep, lead)
    if versions is not None:  # (the selected rows' versions move by their counts, zeroed)
        ver, cnt = versions
        pick = sel if sel is not None else torch.ones_like(idx, dtype=torch.bool)
        pick = pick & (idx >= 0)
        ver.index_add_(0, idx[pick], cnt[pick])
        cnt[pick] = 0
    if sel is not None:
        idx, grad = idx[sel], grad[sel]
    if idx.numel() == 0:
        return
    s = state.index_select(0, idx) + grad.pow(2).mean(dim=1)
    state.index_copy_(0, idx, s)
    index_add_rows(weight, idx, grad * (lr / (s.sqrt() + eps))[:, None], -1.0)


def adagrad_rows(
    weight: torch.Tensor, state: torch.Tensor, idx: torch.Tensor, grad: torch.Tensor,
    lr: float, eps: float, *, keep: torch.Tensor | None = None, lead: torch.Tensor | None = None,
    backend: str = "torch", consume: bool = False, versions: Versions | None = None,
    skip: Skip | None = None,
) -> None:  # fmt: skip
    """Row-wise Adagrad on rows ``idx`` (see the module docstring); ``weight [R, D]`` and
    ``state [R]`` float32 contiguous, ``grad [n, D]`` (or ``[..., D]`` of ``n`` rows).
    ``consume``: the selected rows of ``grad`` (float32, contiguous) are zeroed once used, so a
    caller that adds only into selected rows keeps a zero buffer without refilling it.
    ``versions`` ``(ver [R], cnt [n])`` int64: each selected row's version also moves by its
    entry's count, which is then zeroed (the owner's merged update: one launch fewer)."""
    idx = idx.reshape(-1)
    if consume and (grad.dtype != torch.float32 or not grad.is_contiguous()):
        raise ValueError("adagrad_rows(consume=True) needs a float32 contiguous gradient")
    if skip is not None and (keep is not None or lead is not None):
        raise ValueError("adagrad_rows: skip selects on its own (no keep or lead with it)")
    if skip is not None and (backend == "torch" or idx.numel() == 0):
        keep = (skip[0].reshape(-1) == 0) & (idx != skip[1])
    if backend == "torch" or idx.numel() == 0:
        flat = grad.reshape(-1, grad.shape[-1])
        adagrad_rows_reference(
            weight, state, idx, flat, lr, eps, keep=keep, lead=lead, versions=versions
        )
        if consume:
            sel = _selected(idx, keep, lead)
            flat[sel if sel is not None else slice(None)] = 0
        return
    n, d = idx.numel(), weight.shape[1]
    if grad.numel() != n * d or not weight.is_contiguous() or weight.dtype != torch.float32:
        raise ValueError(f"adagrad_rows: weight {tuple(weight.shape)} vs grad {tuple(grad.shape)}")
    k = _kernels()
    grad = grad.to(torch.float32).contiguous()
    sel, mode = (keep, 1) if keep is not None else (lead, 2) if lead is not None else (idx, 0)
    if skip is not None:
        sel, mode = skip[0].reshape(-1), 3
    if mode == 1:
        sel = sel.to(torch.int8)
    block_r, block_d = row_tiles(k.triton, d)
    block_r = max(1, block_r // 2)  # (two passes over the row: fewer rows per program)
    ver, cnt = versions if versions is not None else (idx, idx)  # (stand-ins, never read)
    with on_device(weight):
        launch(
            k.adagrad, (k.triton.cdiv(n, block_r),),
            (weight, state, idx.contiguous(), grad, sel.contiguous(), ver, cnt, n, float(lr),
             float(eps), -1 if skip is None else int(skip[1])),
            {"D": d, "BLOCK_R": block_r, "BLOCK_D": block_d, "SEL": mode, "CONSUME": consume,
             "VERSIONS": versions is not None},
        )  # fmt: skip


def _selected(
    idx: torch.Tensor, keep: torch.Tensor | None, lead: torch.Tensor | None
) -> torch.Tensor | None:
    """The selected entries as a bool mask, or None for all."""
    if keep is not None:
        return keep.reshape(-1).bool()
    if lead is not None:
        return lead.reshape(-1).long() == torch.arange(idx.numel(), device=idx.device)
    return None
