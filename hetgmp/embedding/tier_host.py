"""Host-memory helpers of the host tier (:mod:`.tiered`): pinned or page-locked host rows,
the cache budget in rows, the hottest-first order of the first residents, the counters.
(Shared with the scorer's host rows, :mod:`hetgmp.serve.rows`.)"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch


class CacheBudgetError(ValueError):
    """A batch needs more distinct rows than the device cache holds, or a bad budget."""


def host_tensor(t: torch.Tensor, device: torch.device, *, copy: bool = True) -> torch.Tensor:
    """``t`` on the CPU, pinned when ``device`` is CUDA (asynchronous copies to and from it);
    ``copy``: never the caller's storage (the tier writes rows back into it; a read-only
    cache, the scorer's, passes False)."""
    t = t.detach().to("cpu")
    if device.type == "cuda":
        return t.pin_memory()
    return t.clone() if copy else t


def register_in_place(t: torch.Tensor) -> bool:
    """Page-lock ``t``'s own memory for asynchronous CUDA copies (``cudaHostRegister``; True
    when done): a table that is most of the host's memory has no room for a pinned copy."""
    if not t.numel() or not t.is_contiguous():
        return False
    try:
        err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
    except (RuntimeError, AttributeError):
        return False
    return int(err) == 0


def unpin_in_place(ptrs: list[int]) -> None:
    """Undo :func:`register_in_place` for these data pointers (when their owner goes away)."""
    for ptr in ptrs:
        torch.cuda.cudart().cudaHostUnregister(ptr)


def hottest_first(counts: torch.Tensor | np.ndarray | None, num_rows: int) -> torch.Tensor:
    """Row ids by descending ``counts`` (ties: lower id first); ``0..num_rows-1`` without."""
    if counts is None:
        return torch.arange(num_rows, dtype=torch.int64)
    c = torch.as_tensor(counts).to(torch.int64).reshape(-1)
    if c.numel() != num_rows:
        raise ValueError(f"row frequencies hold {c.numel()} entries, the table {num_rows} rows")
    return torch.argsort(c, descending=True, stable=True)


def budget_rows(num_rows: int, fraction: float) -> int:
    """Cache rows of a budget given as a fraction ``(0, 1]`` of the table (rounded up)."""
    if not 0.0 < fraction <= 1.0:
        raise CacheBudgetError(f"--cache-budget must be a fraction in (0, 1], got {fraction}")
    return max(1, min(num_rows, math.ceil(fraction * num_rows)))


@dataclasses.dataclass
class TierCounters:
    """What the host tier did, in distinct rows per residency decision, and bytes."""

    hits: int = 0  # distinct batch rows already resident
    misses: int = 0  # distinct batch rows loaded from host memory
    evictions: int = 0  # resident rows dropped for a miss (written back only if updated)
    written_back: int = 0  # updated rows copied back to host memory (evicted or flushed)
    bytes_h2d: int = 0
    bytes_d2h: int = 0
    batches: int = 0  # residency decisions (a batch made resident)
    ahead: int = 0  # ... of them made ahead of the batch's step (prefetch)
    ahead_skipped: int = 0  # expected batches made resident at their step after all

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)
