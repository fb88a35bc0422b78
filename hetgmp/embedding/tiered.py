"""A host tier for a rank's rows: every row and its optimizer state in host memory, a device
cache of ``budget`` rows, and the batch's rows made resident before the batch is trained.

Why: a table larger than the device's memory (issue 33). The host holds the truth for rows not
cached; a cached row's truth is its cache slot (it is written back to host memory when it is
evicted, or at :meth:`TieredRows.flush`, and only if it was updated since it was loaded).

* storage: ``host_weight [N, D]`` float32 and ``host_state [N]`` (row-wise Adagrad; ``[0]``
  for SGD) in host memory, pinned when the device is CUDA (so row copies can be asynchronous);
  ``cache_weight [budget, D]`` / ``cache_state [budget]`` on the device.
* maps: ``slot_of [N]`` int64 (row -> cache slot, or -1 when the row is only on the host; one
  copy in host memory, which decides, and one on the device, which a step reads), ``row_of
  [budget]`` (slot -> row, -1 for an empty slot).
* initial residents: the ``budget`` most frequent rows of the given frequencies (the plan's
  per-row access counts; ties and no counts: lower ids first).
* :meth:`TieredRows.prefetch` (ids of a coming batch): every distinct row of it is made
  resident; the victims are the non-needed slots used least recently, ties broken by the
  fewest uses (empty slots first); counted (hits, misses, evictions, bytes each way).
* :meth:`TieredRows.gather` / :meth:`TieredRows.apply` work on cache slots, with the same
  arithmetic as on an all-resident table (rows are independent in every sparse optimizer), so
  a tiered table equals it bit for bit after the same updates (bound 0 semantics).

This first slice decides residency on the host (:meth:`prefetch` reads the ids there: one host
sync per call on CUDA); prefetching on a copy stream ahead of the step is the GPU slice's work.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from hetgmp.embedding.errors import EmbeddingInputError
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.store import RowStore


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
    """What the host tier did, in distinct rows per :meth:`TieredRows.prefetch` and bytes."""

    hits: int = 0  # distinct batch rows already resident
    misses: int = 0  # distinct batch rows loaded from host memory
    evictions: int = 0  # resident rows dropped for a miss (written back only if updated)
    written_back: int = 0  # updated rows copied back to host memory (evicted or flushed)
    bytes_h2d: int = 0
    bytes_d2h: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class TieredRows:
    """Rows in host memory with a device cache of ``budget`` rows (see the module docstring).
    ``weight [N, D]`` / ``state`` (``[N]`` or ``[0]``): the initial rows (copied);
    ``counts``: per-row access frequencies that pick the initial residents; ``adopt``: keep
    ``weight`` / ``state`` (CPU float32) as the host rows instead of copying them (a CUDA
    device still gets pinned copies: see :func:`tier_rows_of`)."""

    def __init__(
        self, weight: torch.Tensor, state: torch.Tensor, *, device: torch.device, budget: int,
        opt: SparseOptimizer, counts: torch.Tensor | np.ndarray | None = None,
        adopt: bool = False,
    ) -> None:  # fmt: skip
        n, d = weight.shape
        if not 1 <= budget <= n:
            raise CacheBudgetError(f"cache budget must be 1..{n} rows (the table), got {budget}")
        if state.numel() not in (0, n):
            raise ValueError(f"optimizer state of {state.numel()} rows for a table of {n}")
        self.num_rows, self.dim, self.budget, self.opt = n, d, budget, opt
        self.device = device
        self.host_weight = host_tensor(weight.to(torch.float32), device, copy=not adopt)
        self.host_state = host_tensor(state.to(torch.float32), device, copy=not adopt)
        self.state_width = 1 if state.numel() else 0
        self.row_bytes = 4 * (d + self.state_width)
        resident = hottest_first(counts, n)[:budget]
        self.cache_weight = self.host_weight[resident].to(device)
        self.cache_state = self.host_state[resident if self.state_width else slice(0)].to(device)
        self.row_of = resident.clone()  # slot -> row (-1: empty), host
        self._slot_host = torch.full((n,), -1, dtype=torch.int64)
        self._slot_host[resident] = torch.arange(budget, dtype=torch.int64)
        self.slot_of = self._slot_host.to(device)  # (the same tensor on CPU)
        # eviction order: least recently used first (-1: never; empty slots never are), then
        # fewest uses; initial residents start with their frequency as their use count
        self.last_use = torch.zeros(budget, dtype=torch.int64)
        init_uses = torch.as_tensor(counts).to(torch.int64)[resident] if counts is not None else 0
        self.uses = torch.zeros(budget, dtype=torch.int64) + init_uses
        self.dirty = torch.zeros(budget, dtype=torch.bool, device=device)  # updated since load
        self.clock = 0
        self.counters = TierCounters()

    # ------------------------------------------------------------------ residency
    def prefetch(self, ids: torch.Tensor) -> torch.Tensor:
        """Make every row of ``ids`` (any shape, int) resident; returns their cache slots
        (int64, the shape of ``ids``, on the device). Raises :class:`CacheBudgetError` when
        the batch has more distinct rows than the cache, :class:`EmbeddingInputError` for ids
        outside ``[0, N)``; nothing changes then."""
        flat = ids.reshape(-1).to("cpu", torch.int64)
        need = torch.unique(flat)
        if need.numel() and (int(need[0]) < 0 or int(need[-1]) >= self.num_rows):
            raise EmbeddingInputError(
                f"ids outside [0, {self.num_rows}): min {int(need[0])}, max {int(need[-1])}"
            )
        if need.numel() > self.budget:
            raise CacheBudgetError(
                f"a batch holds {need.numel()} distinct rows, but the device cache holds "
                f"{self.budget} of the table's {self.num_rows} rows: raise --cache-budget to "
                f"at least {need.numel() / self.num_rows:.4f} (or train smaller batches)"
            )
        self.clock += 1
        slots = self._slot_host[need]
        hit = slots >= 0
        miss = need[~hit]
        self.counters.hits += int(hit.sum())
        self.counters.misses += int(miss.numel())
        protected = torch.zeros(self.budget, dtype=torch.bool)
        protected[slots[hit]] = True
        if miss.numel():
            victims = self._victims(protected, miss.numel())
            self._evict(victims)
            self._load(miss, victims)
            protected[victims] = True
        used = torch.nonzero(protected).reshape(-1)
        self.last_use[used] = self.clock
        self.uses[used] += 1
        return self.slot_of[ids.to(self.device, torch.int64)]

    def _victims(self, protected: torch.Tensor, k: int) -> torch.Tensor:
        """``k`` slots not ``protected``: empty first, then least recently, fewest used."""
        key_last = torch.where(self.row_of < 0, -1, self.last_use)
        order = torch.argsort(self.uses, stable=True)
        order = order[torch.argsort(key_last[order], stable=True)]
        return order[~protected[order]][:k]

    def _evict(self, victims: torch.Tensor) -> None:
        """Drop the rows in ``victims``' slots, writing the updated ones back to the host."""
        old = self.row_of[victims]
        full = old >= 0
        victims, old = victims[full], old[full]
        if not victims.numel():
            return
        self.counters.evictions += int(victims.numel())
        self._write_back(victims, old)
        self._slot_host[old] = -1
        if self.slot_of is not self._slot_host:
            self.slot_of[old.to(self.device)] = -1
        self.row_of[victims] = -1

    def _write_back(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Copy the updated ones of cache ``slots`` (host rows ``rows``) to host memory."""
        dev_slots = slots.to(self.device)
        upd = self.dirty[dev_slots].cpu()
        if not bool(upd.any()):
            return
        dev_slots, rows = dev_slots[upd.to(self.device)], rows[upd]
        self.host_weight[rows] = self.cache_weight[dev_slots].cpu()
        if self.state_width:
            self.host_state[rows] = self.cache_state[dev_slots].cpu()
        self.dirty[dev_slots] = False
        self.counters.written_back += int(rows.numel())
        self.counters.bytes_d2h += int(rows.numel()) * self.row_bytes

    def _load(self, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Copy host ``rows`` into (empty) cache ``slots``."""
        dev_slots = slots.to(self.device)
        self.cache_weight[dev_slots] = self._staged(self.host_weight[rows])
        if self.state_width:
            self.cache_state[dev_slots] = self._staged(self.host_state[rows])
        self.row_of[slots] = rows
        self._slot_host[rows] = slots
        if self.slot_of is not self._slot_host:
            self.slot_of[rows.to(self.device)] = dev_slots
        self.counters.bytes_h2d += int(rows.numel()) * self.row_bytes

    def _staged(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (gathered host rows) on the device; through pinned memory on CUDA."""
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    # ------------------------------------------------------------------ rows by slot
    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        """``[..., D]`` rows of cache ``slots`` (from :meth:`prefetch`)."""
        return self.cache_weight[slots]

    def apply(self, slots: torch.Tensor, grad: torch.Tensor) -> None:
        """The optimizer's update of the resident rows ``slots`` (may repeat: a row's
        occurrences are summed in order first) with ``grad [..., D]``, one per slot."""
        flat = slots.reshape(-1)
        g = grad.reshape(-1, self.dim).to(torch.float32)
        uniq, inv = torch.unique(flat, return_inverse=True)
        gsum = torch.zeros(uniq.numel(), self.dim, dtype=torch.float32, device=g.device)
        gsum.index_add_(0, inv, g)
        self.opt.apply(self.cache_weight, self.cache_state, uniq, gsum)
        self.mark_updated(uniq)

    def mark_updated(self, slots: torch.Tensor) -> None:
        """Note that cache ``slots`` were written (for a caller updating rows itself)."""
        self.dirty[slots.reshape(-1)] = True

    def flush(self) -> None:
        """Write every updated resident row back, so host memory holds the whole table."""
        full = torch.nonzero(self.row_of >= 0).reshape(-1)
        self._write_back(full, self.row_of[full])

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weight [N, D], state)`` of the whole table, on the CPU (after a flush)."""
        self.flush()
        return self.host_weight, self.host_state

    def resident(self) -> torch.Tensor:
        """The rows in the cache now, by slot (-1: empty)."""
        return self.row_of.clone()

    def reload(self) -> None:
        """Re-read every resident row from host memory (after rows were loaded into it)."""
        full = torch.nonzero(self.row_of >= 0).reshape(-1)
        dev = full.to(self.device)
        self.cache_weight[dev] = self._staged(self.host_weight[self.row_of[full]])
        if self.state_width:
            self.cache_state[dev] = self._staged(self.host_state[self.row_of[full]])
        self.dirty.zero_()


ROWS_ON = ("device", "host")


def check_rows_on(rows_on: str, cache_budget: float, *, world: int, device: torch.device,
                  cuda_graphs: bool) -> None:  # fmt: skip
    """Refuse what the host tier does not support yet (``--rows-on host``)."""
    if rows_on not in ROWS_ON:
        raise ValueError(f"rows_on must be one of {ROWS_ON}, got {rows_on!r}")
    if rows_on == "device":
        return
    budget_rows(1, cache_budget)  # (the fraction's check)
    if world > 1:
        raise ValueError(
            f"--rows-on host is supported on one rank only so far (this job has {world}); "
            "train with --rows-on device, or on one GPU"
        )
    if device.type == "cuda" and cuda_graphs:
        raise ValueError(
            "--rows-on host does not run inside CUDA graphs yet (a prefetch decides residency "
            "on the host); pass --no-cuda-graphs with it"
        )


def tier_rows_of(
    store: RowStore, opt: SparseOptimizer, device: torch.device, cache_budget: float,
    counts: torch.Tensor | np.ndarray | None,
) -> TieredRows:  # fmt: skip
    """A host tier over a one-rank ``store`` (allocated in host memory, slot = id): the tier
    keeps the store's rows as its host rows, and the store's ``weight`` / ``opt_state`` point
    at them, so saving and loading rows by id work on host memory (flush / reload the tier
    around them)."""
    if store.world != 1:
        raise ValueError("a host tier holds the rows of a one-rank table")
    tier = TieredRows(
        store.weight, store.opt_state, device=device, opt=opt, counts=counts, adopt=True,
        budget=budget_rows(store.num_rows, cache_budget),
    )  # fmt: skip
    store.weight = store.weight_full = tier.host_weight
    store.opt_state = store.opt_state_full = tier.host_state
    return tier
