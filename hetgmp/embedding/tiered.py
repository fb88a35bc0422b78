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
* residency is decided on the host (the maps there, a host mask of updated slots, the slots
  a step still updates: *held*): every distinct row of a batch is made resident; the victims
  are slots neither the batch, a held one nor a staged batch's, in CLOCK order (second
  chance: :mod:`.tier_clock`), so a decision costs O(the batch's rows), never O(the cache);
  updated victims are written back; counted (hits, misses, evictions, rows written back,
  bytes each way, batches, batches made resident ahead, slots the clock's hand looked at).
* the step (:mod:`.local`) asks :meth:`TieredRows.lookup` for a batch's slots; the trainer
  tells the table the next batch first (``prefetch`` -> :meth:`TieredRows.expect`), and the
  tier issues that batch's move at the end of the current lookup (:meth:`stage_next`), on a
  copy stream on CUDA (:mod:`.tier_move`), so the next step only waits for its event; on CPU
  the same calls move the rows at once. :meth:`prefetch` makes a batch resident now.
* :meth:`TieredRows.gather` / :meth:`TieredRows.apply` work on cache slots, with the same
  arithmetic as on an all-resident table (rows are independent in every sparse optimizer), so
  a tiered table equals it bit for bit after the same updates (bound 0 semantics).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np
import torch

from hetgmp.embedding.errors import EmbeddingInputError
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.tier_ahead import AheadQueue
from hetgmp.embedding.tier_clock import Clock
from hetgmp.embedding.tier_host import (
    CacheBudgetError,
    SetupClock,
    TierCounters,
    budget_rows,
    check_budget,
    distinct_sorted,
    host_tensor,
    hottest_first,
    positions,
    register_in_place,
    unpin_in_place,
)
from hetgmp.embedding.tier_move import Move, RowMover, columns

__all__ = ["CacheBudgetError", "TierCounters", "TieredRows", "budget_rows", "host_tensor",
           "hottest_first"]  # fmt: skip


class TieredRows:
    """Rows in host memory with a device cache of ``budget`` rows (see the module docstring).
    ``weight [N, D]`` / ``state`` (``[N]`` or ``[0]``): the initial rows (copied);
    ``counts``: per-row access frequencies that pick the initial residents; ``adopt``: keep
    ``weight`` / ``state`` (CPU float32) as the host rows instead of copying them (a CUDA
    device pins them: see :func:`hetgmp.embedding.tier_setup.tier_rows_of`). ``overlap``
    (CUDA): copies on a copy stream and batches made resident a step ahead
    (:mod:`.tier_move`); False: every move at the step, synchronously (the fallback).
    ``clock``: times the start-up's phases (page-locking, the first residents' copy)."""

    def __init__(
        self, weight: torch.Tensor, state: torch.Tensor, *, device: torch.device, budget: int,
        opt: SparseOptimizer, counts: torch.Tensor | np.ndarray | None = None,
        adopt: bool = False, overlap: bool = True, version: torch.Tensor | None = None,
        cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None,
        clock: SetupClock | None = None,
    ) -> None:  # fmt: skip
        n, d = weight.shape
        clock = clock if clock is not None else SetupClock()
        check_budget(budget, n)
        if state.numel() not in (0, n):
            raise ValueError(f"optimizer state of {state.numel()} rows for a table of {n}")
        self.num_rows, self.dim, self.budget, self.opt = n, d, budget, opt
        self.device = device
        self.state_width = 1 if state.numel() else 0
        self.row_bytes = 4 * (d + self.state_width) + 8 * (version is not None)
        with clock.phase("pin" if device.type == "cuda" else "host", bytes=n * self.row_bytes):
            self.host_weight, self.host_state = (
                self._host_rows(t.float(), device, adopt) for t in (weight, state)
            )
            # (several ranks: owned rows' versions travel with them, :mod:`.tier_owned`)
            self.host_version = None if version is None else self._host_rows(version, device, adopt)
        with clock.phase("cache", rows=budget, bytes=budget * self.row_bytes):
            resident = hottest_first(counts, n)[:budget]
            self._cache_of(resident, cache)
        self.row_of = resident.clone()  # slot -> row (-1: empty), host
        self._slot_host = torch.full((n,), -1, dtype=torch.int64)
        self._slot_host[resident] = torch.arange(budget, dtype=torch.int64)
        self.slot_of = self._slot_host.to(device)  # (the same tensor on CPU)
        # eviction order: CLOCK, the hand starting at the coldest initial resident
        self.order = Clock(budget)
        self._dirty = torch.zeros(budget, dtype=torch.bool)  # by slot: updated since loaded
        self._held: list[torch.Tensor] = []  # slots a step still updates (host int64)
        self.counters = TierCounters()
        self.warm_rows = (
            int((torch.as_tensor(counts)[resident] > 0).sum()) if counts is not None else 0
        )
        self.on_move: Callable[[Move], None] | None = None  # (several ranks: the store's map)
        host_cols = columns(self.host_weight, self.host_state, self.host_version)
        cache_cols = columns(self.cache_weight, self.cache_state, self.cache_version)
        self.mover = RowMover(host_cols, cache_cols, self.slot_of, device=device, overlap=overlap)
        self.overlap = overlap
        self.ahead = AheadQueue(self.mover.copy)

    def _cache_of(
        self,
        resident: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None,
    ) -> None:
        """The device cache, holding the ``resident`` rows by slot: new tensors, or the
        caller's ``cache`` (weight, state, version: a store's own region) filled."""
        sw = resident if self.state_width else slice(0)
        if cache is None:
            self.cache_weight = self.host_weight[resident].to(self.device)
            self.cache_state = self.host_state[sw].to(self.device)
            self.cache_version = None
            return
        self.cache_weight, self.cache_state, self.cache_version = cache
        self.cache_weight.copy_(self.host_weight[resident])
        self.cache_state.copy_(self.host_state[sw])
        if self.host_version is not None:
            assert self.cache_version is not None
            self.cache_version.copy_(self.host_version[resident])

    def _host_rows(self, t: torch.Tensor, device: torch.device, adopt: bool) -> torch.Tensor:
        """``t`` as host rows: adopted (CUDA: page-locked in place, unlocked when the tier
        goes away) or copied (pinned for CUDA)."""
        if adopt and device.type == "cuda" and not t.is_pinned() and register_in_place(t):
            weakref.finalize(self, unpin_in_place, [t.data_ptr()])
            return t
        return host_tensor(t, device, copy=not adopt)

    @property
    def slots(self) -> int:
        """Rows of the device cache the step's slots range over (its budget)."""
        return self.budget

    # ------------------------------------------------------------------ residency
    def prefetch(self, ids: torch.Tensor) -> torch.Tensor:
        """Make every row of ``ids`` (any shape, int) resident now; returns their cache slots
        (int64, the shape of ``ids``, on the device). Raises :class:`CacheBudgetError` when
        the batch has more distinct rows than the cache (beside the held ones),
        :class:`EmbeddingInputError` for ids outside ``[0, N)``; nothing changes then."""
        self._resident_now(ids.reshape(-1).to("cpu", torch.int64))
        return self._device_slots(ids)

    # (a CUDA graph cannot hold this tier's lookup: residency is decided on the host)
    graph_ready = False

    def lookup_captured(self, ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the host-decided tier cannot run inside a CUDA graph")

    def before_replay(self) -> None:
        raise RuntimeError("the host-decided tier cannot run inside a CUDA graph")

    def expect(self, ids: torch.Tensor) -> None:
        """(A step's prefetch) the batch of ``ids`` comes next: its rows are made resident
        at the end of the current step's lookup (:meth:`stage_next`), and :meth:`lookup` of
        this very tensor then only waits for that move. A no-op with ``overlap=False``."""
        if self.overlap:
            self.ahead.expect(ids)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """(A step) the cache slots of ``ids``, its rows resident: made so ahead when this
        tensor was expected and staged, else now. The batch's rows are then held (never
        evicted) until :meth:`updated` or :meth:`release`."""
        got = self.ahead.take(ids)
        if got is not None and got.state == "staged":
            assert got.slots is not None
            self.mover.wait(got.move)
            slots = got.slots
        else:
            if got is not None:
                self.counters.ahead_skipped += 1
            flat = got.host_ids() if got is not None else ids.reshape(-1).to("cpu", torch.int64)
            slots = self._resident_now(flat)
        self._held.append(slots)
        return self._device_slots(ids)

    def _device_slots(self, ids: torch.Tensor) -> torch.Tensor:
        """The device map's slots of ``ids`` (shaped as ``ids``; rows checked resident).
        ``index_select``, not ``[]``: on the CPU advanced indexing took ~9x longer (4.5 ms
        vs 0.5 ms for a batch's 213k ids)."""
        flat = ids.reshape(-1).to(self.device, torch.int64)
        return self.slot_of.index_select(0, flat).view(ids.shape)

    def stage_next(self) -> None:
        """Issue the move of the oldest expected batch not staged yet, beside the held rows
        and the staged batches' (CUDA overlapped: on the copy stream; else at once). A batch
        with bad ids, or no room beside them, is left for its lookup (which then reports or
        makes room)."""
        got = self.ahead.next_waiting()
        if got is None:
            return
        need = distinct_sorted(got.host_ids())
        done = None if self._bad(need) else self._decide(need, self._protected())
        if done is None:
            got.state = "skipped"
            return
        got.move, got.slots = done
        got.state = "staged"
        self.counters.ahead += 1

    def updated(self) -> None:
        """The held rows were updated (the step's update was applied): mark them for
        write-back and let them go."""
        for slots in self._held:
            self._dirty.index_fill_(0, slots, True)
        self._held = []

    def release(self) -> None:
        """Let the held rows go (not updated: an evaluation's lookup, a dropped gradient)."""
        self._held = []

    def _protected(self) -> list[torch.Tensor]:
        """Slots no decision may evict: the held ones and the staged batches' (host int64)."""
        return [*self._held, *self.ahead.staged_slots()]

    def _bad(self, need: torch.Tensor) -> bool:
        return bool(need.numel()) and (int(need[0]) < 0 or int(need[-1]) >= self.num_rows)

    def make_resident(
        self, rows: torch.Tensor, keep: list[torch.Tensor], *, batch: bool = True
    ) -> torch.Tensor:
        """(Several ranks, :mod:`.tier_owned`) make ``rows`` (host int64, any order, may
        repeat) resident now without evicting the ``keep`` slots (host int64 tensors, which
        become the held set); their distinct rows' cache slots (host, ascending row order).
        ``batch``: the decision counts as a batch (a step's; not its peers' reads). Refusals
        as :meth:`prefetch`'s."""
        self._held = list(keep)
        return self._resident_now(rows, batch=batch)

    def slots_of(self, rows: torch.Tensor) -> torch.Tensor:
        """The cache slots of ``rows`` (host int64; -1: not resident), from the host map."""
        return self._slot_host.index_select(0, rows)

    def _resident_now(self, flat: torch.Tensor, *, batch: bool = True) -> torch.Tensor:
        """Make the rows of ``flat`` (host int64 ids) resident now; their distinct rows' cache
        slots (host). Refusals as :meth:`prefetch`'s."""
        need = distinct_sorted(flat)
        if self._bad(need):
            raise EmbeddingInputError(
                f"ids outside [0, {self.num_rows}): min {int(need[0])}, max {int(need[-1])}"
            )
        done = self._decide(need, self._protected(), batch)  # (the staged batches' rows kept)
        if done is None and self.ahead.items:  # (no room beside them: they are forgotten)
            self.ahead.clear()
            done = self._decide(need, list(self._held), batch)
        if done is None:  # (more misses than free slots beside the batch's hits and the held)
            raise CacheBudgetError(
                f"a step needs {need.numel()} distinct rows resident beside "
                f"{self._count(self._held)} held ones, but the device cache holds "
                f"{self.budget} of the table's {self.num_rows} rows: raise --cache-budget to "
                f"at least {need.numel() / self.num_rows:.4f} (or train smaller batches)"
            )
        move, slots = done
        self.mover.wait(move)
        return slots

    def _decide(
        self, need: torch.Tensor, protected: list[torch.Tensor], batch: bool = True
    ) -> tuple[Move, torch.Tensor] | None:
        """Residency for the distinct rows ``need`` (host, sorted) without evicting the
        ``protected`` slots: the maps updated on the host, the move issued; None (nothing
        changed) when the misses do not fit beside the protected slots. O(``need`` and the
        protected slots): no pass over the cache."""
        # (index_select / index_copy_ / index_fill_, not [] and []=: on the CPU torch's
        # advanced indexing costs several times more per element; every index is distinct)
        slots = self._slot_host.index_select(0, need)
        hit = slots >= 0  # (positions once: a mask index is a nonzero each time)
        hit_at, miss_at = positions(hit), positions(~hit)
        miss, hit_slots = need.index_select(0, miss_at), slots.index_select(0, hit_at)
        keep = [*protected, hit_slots]
        m = int(miss.numel())
        if m and m > self.budget - self._count(keep, m):
            return None
        victims = self.order.victims(miss.numel(), torch.cat(keep))
        self.order.used(hit_slots)
        self.order.loaded(victims)
        ev_slots, ev_rows = victims, self.row_of.index_select(0, victims)
        if miss.numel() and int(ev_rows.min()) < 0:  # (empty slots: nothing to evict there)
            full = positions(ev_rows >= 0)
            ev_slots, ev_rows = victims.index_select(0, full), ev_rows.index_select(0, full)
        wb = positions(self._dirty.index_select(0, ev_slots))
        move = Move(ev_slots.index_select(0, wb), ev_rows.index_select(0, wb), miss, victims,
                    ev_rows)  # fmt: skip
        self._dirty.index_fill_(0, victims, False)
        self._slot_host.index_fill_(0, ev_rows, -1)
        self.row_of.index_copy_(0, victims, miss)
        self._slot_host.index_copy_(0, miss, victims)
        slots.index_copy_(0, miss_at, victims)
        if self.on_move is not None:
            self.on_move(move)
        self._count_decision(int(hit_at.numel()), move, batch)
        return self.mover.run(move), slots

    def _count(self, slots: list[torch.Tensor], miss: int = 0) -> int:
        """Distinct slots in ``slots`` (host int64 tensors). With ``miss`` > 0: any count up
        to ``budget - miss`` stands for "room for ``miss`` more" -- their total length when
        that bound already holds (a 10 % cache: every step), without deduplicating them."""
        if not slots:
            return 0
        total = sum(int(s.numel()) for s in slots)
        if miss and total <= self.budget - miss:
            return total
        return int(distinct_sorted(torch.cat(slots)).numel())

    def _count_decision(self, hits: int, move: Move, batch: bool) -> None:
        c = self.counters
        c.batches += int(batch)
        c.hits += hits
        c.misses += int(move.load_rows.numel())
        c.evictions += int(move.evicted_rows.numel())
        c.written_back += int(move.wb_rows.numel())
        c.bytes_h2d += int(move.load_rows.numel()) * self.row_bytes
        c.bytes_d2h += int(move.wb_rows.numel()) * self.row_bytes
        c.scanned = self.order.scanned

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
        """Note that cache ``slots`` were written (for a caller updating rows itself; device
        slots are read on the host: a sync on CUDA, which the step avoids with
        :meth:`updated`)."""
        self._dirty[slots.reshape(-1).cpu()] = True

    def flush(self) -> None:
        """Write every updated resident row back, so host memory holds the whole table."""
        self.mover.settle()
        slots = torch.nonzero(self._dirty & (self.row_of >= 0)).reshape(-1)
        if not slots.numel():
            return
        rows = self.row_of[slots]
        self.mover.write_back_now(slots, rows)
        self._dirty[slots] = False
        self.counters.written_back += int(rows.numel())
        self.counters.bytes_d2h += int(rows.numel()) * self.row_bytes

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weight [N, D], state)`` of the whole table, on the CPU (after a flush)."""
        self.flush()
        return self.host_weight, self.host_state

    def resident(self) -> torch.Tensor:
        """The rows in the cache now, by slot (-1: empty)."""
        return self.row_of.clone()

    def reload(self) -> None:
        """Re-read every resident row from host memory (after rows were loaded into it; the
        caller flushed before). Expected batches are forgotten."""
        self.mover.settle()
        self.ahead.clear()
        full = torch.nonzero(self.row_of >= 0).reshape(-1)
        self.mover.load_now(self.row_of[full], full)
        self._dirty.zero_()

    def memory(self) -> dict[str, int]:
        """Bytes: ``device`` (the cache's rows and state, the device slot map) and ``host``
        (every row and its state; pinned for CUDA)."""
        dev = self.cache_weight.nbytes + self.cache_state.nbytes
        host = self.host_weight.nbytes + self.host_state.nbytes
        if self.cache_version is not None and self.host_version is not None:
            dev, host = dev + self.cache_version.nbytes, host + self.host_version.nbytes
        if self.slot_of is not self._slot_host:
            dev += self.slot_of.nbytes
        return {"device": dev, "host": host}
