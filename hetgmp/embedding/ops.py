"""Small tensor helpers of the embedding runtime that stay free of host syncs on CUDA.

On CUDA every ``.item()``, ``.tolist()``, ``nonzero``, boolean-mask index and ``torch.unique``
waits for the device. The helpers here replace them by fixed-size ops whose output sizes are
either the input's size or a count the host already knows (from an exchanged sizes table).
"""

from __future__ import annotations

import torch


def index_add_rows(
    t: torch.Tensor, idx: torch.Tensor, src: torch.Tensor, alpha: float = 1.0
) -> torch.Tensor:
    """``t.index_add_(0, idx, src, alpha=alpha)``, skipped when ``idx`` is empty.

    Why: torch's CUDA ``index_add_`` with an EMPTY index on a tensor of more than 2**31 elements
    (e.g. a 33.8M x 128 float32 table) fails with ``CUDA error: invalid argument`` (verified on
    H100/H200, torch 2.11 + CUDA 13). ``idx.numel()`` is a host-known shape, so the guard costs
    no sync. Use this for every ``index_add_`` whose target can be huge."""
    if idx.numel() == 0:
        return t
    return t.index_add_(0, idx, src, alpha=alpha)


def stable_partition(
    mask: torch.Tensor, ar: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, count)``: the positions of the 1-D ``mask``'s true entries, in order, then those
    of its false entries, in order (``[n]`` int64), and the number of true entries (``[1]``,
    on the device: fixed shapes, no sync). ``ar``: ``arange(n)`` int64 if the caller keeps
    one. One scatter, every target distinct (no write conflicts)."""
    n = mask.numel()
    if ar is None:
        ar = torch.arange(n, device=mask.device)
    c = torch.cumsum(mask, 0)
    count = c[-1:]
    dst = torch.where(mask, c - 1, count + ar - c)
    return torch.empty(n, dtype=torch.int64, device=mask.device).scatter_(0, dst, ar), count


def compact(mask: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the ``True`` entries of the 1-D ``mask``, in order; ``k`` is their count,
    which the caller knows on the host (so, unlike ``nonzero``, no device sync): the first
    ``k`` of :func:`stable_partition`."""
    if k == 0 or mask.numel() == 0:
        return torch.zeros(0, dtype=torch.int64, device=mask.device)
    return stable_partition(mask)[0][:k]


def current_stream(device: torch.device) -> torch.cuda.Stream:
    """``torch.cuda.current_stream(device)`` for a CUDA device, without its argument parsing
    (``_get_device_index``: ~15-20 us of host time per call on the H200 machine, and a
    padded step asked four times; bench/gpu/profile_host.py)."""
    get = getattr(torch._C, "_cuda_getCurrentStream", None)
    if get is None:  # (another torch: the public call)
        return torch.cuda.current_stream(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    sid, idx, dtype = get(index)
    return torch.cuda.Stream(stream_id=sid, device_index=idx, device_type=dtype)
