"""Host-memory helpers of the host tier (:mod:`.tiered`): pinned or page-locked host rows,
the cache budget in rows, the hottest-first order of the first residents, the counters, the
start-up's phase lines. (Shared with the scorer's host rows, :mod:`hetgmp.serve.rows`.)"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator

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
    """Row ids by descending ``counts`` (ties: lower id first); ``0..num_rows-1`` without.
    Only the counted rows are sorted (a training split touches a few % of a large table's
    rows); the rows never counted follow in id order, as a stable sort would put them."""
    if counts is None:
        return torch.arange(num_rows, dtype=torch.int64)
    c = torch.as_tensor(counts).to(torch.int64).reshape(-1)
    if c.numel() != num_rows:
        raise ValueError(f"row frequencies hold {c.numel()} entries, the table {num_rows} rows")
    if bool((c < 0).any()):  # (negative counts would sort after the zeros)
        return torch.argsort(c, descending=True, stable=True)
    used = c > 0
    hot = torch.nonzero(used).reshape(-1)
    hot = hot[torch.argsort(c[hot], descending=True, stable=True)]
    return torch.cat([hot, torch.nonzero(~used).reshape(-1)])


def distinct_sorted(ids: torch.Tensor) -> torch.Tensor:
    """The distinct values of host int64 ``ids`` (any shape), ascending: ``torch.unique(ids)``'s
    result, by numpy's sort (vectorized on x86) and a neighbour compare. Why: a step's
    residency decision dedups the batch's ~213k ids; torch's CPU unique took 5.5 ms of it on
    one thread of the dev box, this 0.8 ms (bench/results/host_tier_startup_cpu.md)."""
    a = np.sort(ids.detach().reshape(-1).to("cpu", torch.int64).numpy())  # (a fresh array)
    if a.size > 1:
        first = np.empty(a.size, dtype=bool)
        first[0] = True
        np.not_equal(a[1:], a[:-1], out=first[1:])
        a = a[first]
    return torch.from_numpy(a)


def positions(mask: torch.Tensor) -> torch.Tensor:
    """The positions (int64, ascending) of the True entries of a 1-D host bool ``mask``:
    ``torch.nonzero(mask).reshape(-1)``, by numpy (~10x faster on the CPU: 0.03 ms vs 0.3 ms
    at a batch's 85k distinct rows)."""
    return torch.from_numpy(np.flatnonzero(mask.numpy()))


class SetupClock:
    """The host tier's start-up phases, timed: each reported (``note``, e.g. the run's log)
    as one parseable line, ``host tier setup: <phase> <key> <value> ... elapsed_s <s>``, when
    it ends (a table of tens of millions of rows takes seconds per phase); ``seconds`` keeps
    every phase's time."""

    def __init__(self, note: Callable[[str], None] | None = None) -> None:
        self.note = note
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str, **fields: int) -> Iterator[dict[str, int]]:
        """Time the enclosed work as phase ``name`` (``fields``: its sizes, on its line; the
        work may add more to the dict it is given)."""
        t0 = time.perf_counter()
        yield fields
        dt = time.perf_counter() - t0
        self.seconds[name] = self.seconds.get(name, 0.0) + dt
        if self.note is not None:
            kv = "".join(f" {k} {v}" for k, v in fields.items())
            self.note(f"host tier setup: {name}{kv} elapsed_s {dt:.2f}")


def check_budget(budget: int, num_rows: int) -> None:
    """Refuse a cache of ``budget`` rows that is not 1..``num_rows`` (the table)."""
    if not 1 <= budget <= num_rows:
        raise CacheBudgetError(f"cache budget must be 1..{num_rows} rows (the table), got {budget}")


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
    scanned: int = 0  # cache slots the eviction hand looked at (O(misses), not O(cache))

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)
