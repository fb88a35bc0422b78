"""The host tier decided on the device (issue 33, ``docs/host_tier_plan.md``): one rank's rows
and optimizer state in host memory, the hottest ``C`` on the device, and each batch's missed
rows gathered into miss entries by the device itself, with no host work per step.

The device holds one *working table* ``cache_weight [C + M, D]`` (and ``cache_state``): the
cached rows in slots ``[0, C)``, then ``M`` miss entries. :meth:`DeviceTier.lookup` maps a
batch's ids to working slots (:func:`.tier_misses.miss_slots`) and gathers the missed rows
(and their state) from host memory into their entries, through a zero-copy view of it on CUDA
(:mod:`.uva`: the GPU reads pinned host memory itself); :meth:`DeviceTier.updated`, after the
step's update, writes the entries back the same way. The step in between is the one-rank step
on working slots, the arithmetic of an all-resident table, so results are equal to it.

Which rows are cached: the hottest by the given per-row counts (the plan's frequencies) at
first; every :data:`ADAPT_EVERY` lookups the hottest by the occurrences seen since (the rows
cached now winning ties) replace them (:meth:`DeviceTier.adapt`: leaving rows written back,
entering ones loaded; counted), so residency follows drifting access. ``M``: the largest batch
seen (its occurrences: no batch can have more distinct misses); the working table grows when
a larger batch comes (its buffers replaced: the step reads them from the tier every call).
One rank's default (:data:`hetgmp.embedding.tier_setup.DEVICE_TIER`; several ranks keep the
host-decided tier). No host read per step: the one-rank step's CUDA graph holds the lookup and
the write-back (:meth:`DeviceTier.lookup_captured`, :meth:`DeviceTier.before_replay`).
"""

from __future__ import annotations

import weakref

import torch

from hetgmp.embedding.kernels import put_rows, take_rows
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.tier_host import (
    SetupClock,
    TierCounters,
    check_budget,
    hottest_first,
    unpin_in_place,
)
from hetgmp.embedding.tier_misses import miss_slots, miss_slots_fused
from hetgmp.embedding.uva import device_view, register_mapped

# Lookups between re-picks of the cached rows (each a sort of the table's counts and a host
# read: rare enough to cost nothing per step).
ADAPT_EVERY = 1000


class DeviceTier:
    """Rows ``weight [N, D]`` and ``state`` (``[N]`` row-wise Adagrad, or empty) kept in host
    memory (adopted, not copied: on CUDA page-locked in place), ``budget`` of them cached on
    ``device`` (the hottest by ``counts``). The interface of :class:`.tiered.TieredRows`
    that the one-rank step uses."""

    def __init__(
        self, weight: torch.Tensor, state: torch.Tensor, *, device: torch.device, budget: int,
        opt: SparseOptimizer, counts: torch.Tensor | None = None, kernels: str = "torch",
        clock: SetupClock | None = None,
    ) -> None:  # fmt: skip
        n, d = weight.shape
        clock = clock if clock is not None else SetupClock()
        check_budget(budget, n)
        self.num_rows, self.dim, self.budget, self.opt = n, d, budget, opt
        self.device, self.kernels = device, kernels
        self.state_width = 1 if state.numel() else 0
        self.row_bytes = 4 * (d + self.state_width)
        self.host_weight, self.host_state = weight, state.reshape(-1, 1)[:, :1]
        with clock.phase("pin" if device.type == "cuda" else "host", bytes=n * self.row_bytes):
            self._pin(weight, state)
        self._host_w = device_view(weight, device)
        self._host_s = device_view(self.host_state, device) if self.state_width else None
        self.row_of = hottest_first(counts, n)[:budget].to(device)  # cache slot -> row
        self.slot_of = torch.full((n,), -1, dtype=torch.int32, device=device)
        self.slot_of[self.row_of] = torch.arange(budget, dtype=torch.int32, device=device)
        self._pos = torch.zeros(n + 1, dtype=torch.int32, device=device)  # (scratch)
        warm = None if counts is None else torch.as_tensor(counts)[self.row_of.cpu()]
        self.warm_rows = 0 if warm is None else int((warm > 0).sum())
        self._entries = 0
        self.cache_weight = torch.zeros(budget, d, device=device)  # (then the entries: _grow)
        self.cache_state = torch.zeros(budget * self.state_width, device=device)
        self._grow(1)
        with clock.phase("cache", rows=budget, bytes=budget * self.row_bytes):
            self.reload()
        self._rows: torch.Tensor | None = None  # the last lookup's missed rows (-1: none)
        self._misses = torch.zeros((), dtype=torch.int64, device=device)  # (their count)
        self._dev = torch.zeros(3, dtype=torch.int64, device=device)  # hits, misses, written
        self._batches = 0
        self._seen = torch.zeros(n, dtype=torch.int32, device=device)  # occurrences since adapt
        self.adapted = 0  # rows that entered the cache at a re-pick

    def _pin(self, weight: torch.Tensor, state: torch.Tensor) -> None:
        """(CUDA) page-lock the host rows in place, mapped for the GPU, unlocked when the tier
        goes (adopted rows: no second copy of the table)."""
        if self.device.type != "cuda":
            return
        locked = []
        for t in (weight, state):
            if t.numel() and not t.is_pinned():
                if not register_mapped(t):
                    raise RuntimeError("the host rows could not be page-locked for the GPU")
                locked.append(t.data_ptr())
        weakref.finalize(self, unpin_in_place, locked)

    @property
    def slots(self) -> int:
        """Rows of the working table (the step's slots range over them): the cached rows
        (``budget``), then the miss entries."""
        return self.budget + self._entries

    def reserve(self, occurrences: int) -> None:
        """Room for batches of up to ``occurrences`` ids now (the run's largest batch, before
        training: the memory plan then shows the miss entries, and no later batch grows the
        working table, which would capture the step's graph again)."""
        self._grow(occurrences)

    def _grow(self, entries: int) -> None:
        """A working table with ``entries`` miss entries (the cached rows kept)."""
        if entries <= self._entries:
            return
        c, d = self.budget, self.dim
        self._miss_rows = torch.full((entries,), -1, dtype=torch.int64, device=self.device)
        w = torch.zeros(c + entries, d, device=self.device)
        s = torch.zeros(c + entries if self.state_width else 0, device=self.device)
        w[:c] = self.cache_weight[:c]
        s[: c * self.state_width] = self.cache_state[: c * self.state_width]
        self.cache_weight, self.cache_state, self._entries = w, s, entries

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """The working slots of ``ids`` (int, any shape, on the device), the missed rows
        gathered into their entries. An id outside ``[0, N)`` reads no row: its slot is
        :attr:`slots` (past the working table), which the step's own range check reports
        (naming the batch), so nothing here reads the device."""
        self.tick()
        return self._slots(ids)

    def lookup_captured(self, ids: torch.Tensor) -> torch.Tensor:
        """:meth:`lookup` while a CUDA graph captures the step: the host's part of a lookup
        (:meth:`tick`) runs before each replay instead (:meth:`before_replay`)."""
        if ids.numel() > self._entries:  # (growing would move the tensors the graph holds)
            raise RuntimeError(
                f"a captured lookup of {ids.numel()} ids exceeds the {self._entries} miss entries"
            )
        return self._slots(ids)

    def tick(self) -> None:
        """The host's part of a lookup, before it: the cached rows re-picked every
        :data:`ADAPT_EVERY` lookups, and the lookup counted."""
        if self._batches and self._batches % ADAPT_EVERY == 0:
            self.adapt()
        self._batches += 1

    def before_replay(self) -> None:
        """A replayed step's lookup is about to run (:meth:`tick`)."""
        self.tick()

    @property
    def graph_ready(self) -> bool:
        """Whether a CUDA graph can hold the lookup and write-back: the Triton row kernels
        skip the padding entries themselves (torch's path lists them: a host sync)."""
        return self.kernels == "triton"

    def _slots(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).to(self.device, torch.int64)
        self._grow(flat.numel())
        if self.kernels == "triton":  # (three kernels; bad ids refused inside)
            plan = miss_slots_fused(
                flat, self.slot_of, self._pos, self.budget, self._entries, seen=self._seen,
                hits=self._dev[0:1], rows=self._miss_rows,
            )  # fmt: skip
            slots = plan.slots
        else:
            bad = (flat < 0) | (flat >= self.num_rows)
            # (a bad id stands for row N - 1 until its error stops the job: its slot is refused)
            flat = flat.clamp(0, self.num_rows - 1)
            self._seen.index_add_(0, flat, (~bad).to(torch.int32))
            plan = miss_slots(flat, self.slot_of, self._pos, self.budget, self._entries)
            self._count_hits(flat, plan.slots)
            slots = torch.where(bad, self.slots, plan.slots)
        self._dev[1] += plan.misses
        self._rows, self._misses = plan.rows, plan.misses
        self._move(plan.rows, to_host=False)
        return slots.view(ids.shape)

    def adapt(self) -> None:
        """Re-pick the cached rows: the hottest by occurrences since the last re-pick (a row
        cached now wins a tie, so equal counts move nothing); leaving rows are written back
        and their slots take the entering rows, loaded from host memory. Between steps only
        (no lookup's slots in use)."""
        c = self.budget
        score = self._seen * 2  # (int32: 4 bytes a row of the table, once per re-pick)
        score[self.row_of] += 1
        hot = torch.topk(score, c, sorted=False).indices
        stays = torch.zeros_like(self._seen, dtype=torch.bool)
        stays[hot] = True
        leave = torch.nonzero(~stays[self.row_of]).reshape(-1)  # (cache slots)
        if leave.numel():
            self.flush(slots=leave)
            self._dev[2] += leave.numel()
            cached = torch.zeros_like(stays)
            cached[self.row_of] = True
            enter = hot[~cached[hot]]
            self.slot_of[self.row_of[leave]] = -1
            self.row_of[leave] = enter
            self.slot_of[enter] = leave.to(torch.int32)
            self._load(leave)
            self.adapted += int(leave.numel())
        self._seen.zero_()

    def _count_hits(self, flat: torch.Tensor, slots: torch.Tensor) -> None:
        """The batch's distinct cached rows, added on the device (scratch ``_pos`` again)."""
        hit = slots < self.budget
        at = torch.arange(flat.numel(), dtype=torch.int32, device=self.device)
        self._pos.index_copy_(0, torch.where(hit, flat, self.num_rows), at)
        self._dev[0] += (hit & (self._pos.index_select(0, flat) == at)).sum()

    def _move(self, rows: torch.Tensor, *, to_host: bool) -> None:
        """Miss entries ``[C, C + M)`` from host memory (``to_host`` False) or back to it, for
        the entries whose row is not -1 (nothing else crosses the bus)."""
        c, k = self.budget, self.kernels
        pairs = [(self._host_w, self.cache_weight)]
        if self._host_s is not None:
            pairs.append((self._host_s, self.cache_state.view(-1, 1)))
        for host, work in pairs:
            entries = work[c : c + rows.numel()]
            if to_host:
                _put_valid(host, rows, entries, k)
            else:
                take_rows(host, rows, out=entries, backend=k, skip_negative=True)

    def updated(self) -> None:
        """The step's update was applied: the miss entries written back to host memory."""
        if self._rows is not None:
            self._move(self._rows, to_host=True)
            self._dev[2] += self._misses  # (the rows listed: one per miss entry in use)
            self._rows = None

    def release(self) -> None:
        """The last lookup's rows were not updated (an evaluation): nothing to write back."""
        self._rows = None

    def expect(self, ids: torch.Tensor) -> None:
        """(The host tier's read-ahead) nothing: a lookup gathers its misses itself."""

    def stage_next(self) -> None:
        """(The host tier's read-ahead) nothing to stage."""

    def prefetch(self, ids: torch.Tensor) -> torch.Tensor:
        """:meth:`lookup` (the host tier's name for making a batch resident now)."""
        return self.lookup(ids)

    @property
    def counters(self) -> TierCounters:
        """Distinct rows hit and missed per batch, rows written back, cached rows replaced at
        re-picks (``evictions``), bytes each way (reads the device)."""
        hits, misses, written = (int(v) for v in self._dev.tolist())
        return TierCounters(
            hits=hits, misses=misses, written_back=written, batches=self._batches,
            evictions=self.adapted,
            bytes_h2d=misses * self.row_bytes, bytes_d2h=written * self.row_bytes,
        )  # fmt: skip

    def flush(self, slots: torch.Tensor | None = None) -> None:
        """Write the cached rows back (those of ``slots`` only, when given), so host memory
        holds the whole table."""
        at = torch.arange(self.budget, device=self.device) if slots is None else slots
        rows = self.row_of.index_select(0, at)
        _put_valid(self._host_w, rows, self.cache_weight.index_select(0, at), self.kernels)
        if self._host_s is not None:
            state = self.cache_state.index_select(0, at).view(-1, 1)
            _put_valid(self._host_s, rows, state, self.kernels)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weight [N, D], state)`` of the whole table, on the CPU (after a flush)."""
        self.flush()
        return self.host_weight, self.host_state.reshape(-1)[: self.num_rows * self.state_width]

    def reload(self) -> None:
        """Re-read the cached rows from host memory (after rows were loaded into it)."""
        self._load(torch.arange(self.budget, device=self.device))

    def _load(self, slots: torch.Tensor) -> None:
        """Cache ``slots`` read from host memory (their rows' values and state)."""
        rows = self.row_of.index_select(0, slots)
        self.cache_weight[slots] = take_rows(self._host_w, rows, backend=self.kernels)
        if self._host_s is not None:
            state = take_rows(self._host_s, rows, backend=self.kernels)
            self.cache_state[slots] = state.reshape(-1)

    def memory(self) -> dict[str, int]:
        """Bytes: ``device`` (the working table: cached rows and ``entries`` miss entries, their
        state, the slot map and scratch) and ``host``."""
        dev = self.cache_weight.nbytes + self.cache_state.nbytes + self._miss_rows.nbytes
        dev += self.slot_of.nbytes + self._pos.nbytes + self.row_of.nbytes + self._seen.nbytes
        host = self.host_weight.nbytes + self.host_state.nbytes
        return {"device": dev, "host": host, "entries": self._entries}


def _put_valid(host: torch.Tensor, rows: torch.Tensor, src: torch.Tensor, kernels: str) -> None:
    """``host[rows[i]] = src[i]`` where ``rows[i] >= 0`` (Triton skips the others itself)."""
    if kernels == "triton":
        put_rows(host, rows, src, backend="triton")
        return
    at = torch.nonzero(rows >= 0).reshape(-1)
    host.index_copy_(0, rows.index_select(0, at), src.index_select(0, at))
