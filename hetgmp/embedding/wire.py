"""Byte layout helpers of the payloads: every payload travels as one float32 tensor, int64 and
int32 fields as their bytes (no copies where the layout allows)."""

from __future__ import annotations

import torch


def f32(x: torch.Tensor) -> torch.Tensor:
    """The bytes of an int64/int32/float32 tensor as a flat float32 tensor (no copy)."""
    if x.dim() != 1 or not x.is_contiguous():  # host-side checks: no op dispatched
        x = x.contiguous().reshape(-1)
    return x.view(torch.float32)


def i64(x: torch.Tensor) -> torch.Tensor:
    """float32 lanes (pairs) -> flat int64; copies only when the lanes are not 8-byte aligned."""
    if x.dim() != 1 or not x.is_contiguous():
        x = x.contiguous().reshape(-1)
    if x.storage_offset() % 2:
        x = x.clone()
    return x.view(torch.int64)


def join(
    pieces: list[torch.Tensor] | tuple[torch.Tensor, ...],
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Concatenate, skipping empty pieces; one non-empty piece is returned as is (no copy)."""
    full = [p for p in pieces if p.numel()]
    if not full:
        return torch.zeros(0, dtype=pieces[0].dtype if len(pieces) else dtype, device=device)
    return full[0] if len(full) == 1 else torch.cat(full)
