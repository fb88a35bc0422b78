"""Moving rows between the host tier's host memory and its device cache (:mod:`.tiered`).

A :class:`Move` is what one residency decision asks for, all decided on the host: the updated
rows of the evicted slots to write back, the missed rows to load into the freed slots, and the
device slot map's changes. :class:`RowMover` carries it out:

* **CPU** (and ``overlap=False`` on CUDA): at once, in the caller's thread and stream -- the
  same arithmetic, so a tiered table equals an all-resident one bit for bit (the tests run this
  path).
* **CUDA** (``overlap=True``): on a copy stream of its own, so the step does not wait. Written
  to be obviously right; it cannot be run on the CPU-only machine where it was written (the
  benchmark ``bench/gpu/host_tier.sh`` runs it on a GPU). Order on the copy stream:

  1. wait for an event recorded on the compute stream when the move is issued: every update
     and gather of the evicted slots was enqueued before it (the slots a step still needs are
     protected by the caller, never evicted);
  2. the move's slot / row indices: one pinned int64 buffer, one non-blocking copy;
  3. write-back: the updated victims' rows (+ state) gathered on the device and copied into a
     pinned buffer (non-blocking); the host scatters them into host memory only after the
     move's event (:meth:`RowMover.settle`, before any later read of host rows);
  4. load: the missed rows gathered on the host (``index_select`` into one pinned staging
     buffer: rows then state), one non-blocking copy, then ``index_copy_`` into the cache;
  5. the device slot map: evicted rows -> -1, loaded rows -> their slots;
  6. an event (``Move.done``); a step that reads these slots makes its stream wait on it.

  Pinned buffers come from torch's caching host allocator, which reuses a block only after
  the copies that used it are done; device temporaries are allocated and used on the copy
  stream only. Before a move writes new pinned buffers the previous move is settled (a host
  wait for an event a step old, normally long done).
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class Move:
    """One residency decision's data movement (host int64 tensors)."""

    wb_slots: torch.Tensor  # updated victims' cache slots, written back to ...
    wb_rows: torch.Tensor  # ... these host rows
    load_rows: torch.Tensor  # missed host rows, loaded into ...
    load_slots: torch.Tensor  # ... these cache slots
    evicted_rows: torch.Tensor  # every evicted row (its device slot map entry -> -1)
    done: torch.cuda.Event | None = None  # (CUDA, overlapped) set when issued

    def empty(self) -> bool:
        return not (self.wb_slots.numel() or self.load_rows.numel() or self.evicted_rows.numel())


class RowMover:
    """Carries out :class:`Move` s for one tier's tensors (see the module docstring).
    ``host_weight [N, D]`` / ``host_state`` (``[N]`` or ``[0]``) on the host (pinned for CUDA),
    ``cache_weight [budget, D]`` / ``cache_state`` and ``slot_of [N]`` on ``device`` (on CPU
    ``slot_of`` is the host map itself, already updated by the decision)."""

    def __init__(
        self, host_weight: torch.Tensor, host_state: torch.Tensor, cache_weight: torch.Tensor,
        cache_state: torch.Tensor, slot_of: torch.Tensor, *, device: torch.device,
        overlap: bool,
    ) -> None:  # fmt: skip
        self.hw, self.hs, self.cw, self.cs, self.slot_of = (
            host_weight, host_state, cache_weight, cache_state, slot_of,
        )  # fmt: skip
        self.device, self.dim = device, host_weight.shape[1]
        self.has_state = host_state.numel() > 0
        self.overlap = overlap and device.type == "cuda"
        self.copy: torch.cuda.Stream | None = torch.cuda.Stream(device) if self.overlap else None
        self._last: Move | None = None  # the last overlapped move (its event, its write-back)
        self._wb_pinned: torch.Tensor | None = None  # its write-back's rows (+ state), pinned

    # ------------------------------------------------------------------ either path
    def run(self, move: Move) -> Move:
        """Issue ``move`` (CPU: done on return; CUDA overlapped: ``move.done`` is its event)."""
        if move.empty():
            return move
        if self.copy is None:
            self._run_now(move)
        else:
            self._run_on_copy_stream(move)
        return move

    def wait(self, move: Move | None) -> None:
        """Make the current stream wait for ``move``'s copies (nothing on CPU / sync)."""
        if move is not None and move.done is not None:
            torch.cuda.current_stream(self.device).wait_event(move.done)

    def settle(self) -> None:
        """The last overlapped move finished on the host: its event waited for, its
        write-back scattered into host memory. Host rows are read only after this."""
        last, self._last = self._last, None
        if last is None or last.done is None:
            return
        last.done.synchronize()
        n = last.wb_rows.numel()
        if n:
            buf = self._wb_pinned
            assert buf is not None
            self.hw[last.wb_rows] = buf[: n * self.dim].view(n, self.dim)
            if self.has_state:
                self.hs[last.wb_rows] = buf[n * self.dim : n * (self.dim + 1)]
        self._wb_pinned = None

    # ------------------------------------------------------------------ CPU / synchronous
    def _run_now(self, move: Move) -> None:
        """The move in the caller's stream: write-back, then load (into the same slots)."""
        if move.wb_slots.numel():
            dev = move.wb_slots.to(self.device)
            self.hw[move.wb_rows] = self.cw[dev].cpu()
            if self.has_state:
                self.hs[move.wb_rows] = self.cs[dev].cpu()
        if move.load_rows.numel():
            dev = move.load_slots.to(self.device)
            self.cw[dev] = _to_device(self.hw[move.load_rows], self.device)
            if self.has_state:
                self.cs[dev] = _to_device(self.hs[move.load_rows], self.device)
        if self.slot_of.device.type != "cpu":  # (on CPU the decision updated the one map)
            if move.evicted_rows.numel():
                self.slot_of[move.evicted_rows.to(self.device)] = -1
            if move.load_rows.numel():
                self.slot_of[move.load_rows.to(self.device)] = move.load_slots.to(self.device)

    # ------------------------------------------------------------------ CUDA, overlapped
    def _run_on_copy_stream(self, move: Move) -> None:
        """The move on the copy stream (module docstring, steps 1-6). Untested here (no GPU
        on the machine it was written on); ``overlap=False`` is the synchronous fallback."""
        assert self.copy is not None
        self.settle()  # (host rows current; the previous move's pinned buffers released)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.device))
        w, m, e = move.wb_slots.numel(), move.load_rows.numel(), move.evicted_rows.numel()
        idx = torch.empty(w + 2 * m + e, dtype=torch.int64, pin_memory=True)
        torch.cat([move.wb_slots, move.load_slots, move.load_rows, move.evicted_rows], out=idx)
        stage = self._stage_loads(move.load_rows) if m else None
        width = self.dim + int(self.has_state)
        with torch.cuda.stream(self.copy):
            self.copy.wait_event(ready)
            idx_dev = idx.to(self.device, non_blocking=True)
            wb_slots, load_slots = idx_dev[:w], idx_dev[w : w + m]
            load_rows, evicted = idx_dev[w + m : w + 2 * m], idx_dev[w + 2 * m :]
            if w:  # write-back before the loads reuse the slots (same stream: in order)
                got = torch.empty(w * width, dtype=torch.float32, device=self.device)
                got[: w * self.dim].view(w, self.dim).copy_(self.cw.index_select(0, wb_slots))
                if self.has_state:
                    got[w * self.dim :].copy_(self.cs.index_select(0, wb_slots))
                self._wb_pinned = torch.empty(w * width, dtype=torch.float32, pin_memory=True)
                self._wb_pinned.copy_(got, non_blocking=True)
            if stage is not None:
                rows = stage.to(self.device, non_blocking=True)
                self.cw.index_copy_(0, load_slots, rows[: m * self.dim].view(m, self.dim))
                if self.has_state:
                    self.cs.index_copy_(0, load_slots, rows[m * self.dim :])
            if e:
                self.slot_of.index_fill_(0, evicted, -1)
            if m:
                self.slot_of.index_copy_(0, load_rows, load_slots)
            move.done = torch.cuda.Event()
            move.done.record(self.copy)
        self._last = move

    def _stage_loads(self, rows: torch.Tensor) -> torch.Tensor:
        """The missed rows (then their state) gathered on the host into one pinned buffer."""
        m = rows.numel()
        width = self.dim + int(self.has_state)
        stage = torch.empty(m * width, dtype=torch.float32, pin_memory=True)
        torch.index_select(self.hw, 0, rows, out=stage[: m * self.dim].view(m, self.dim))
        if self.has_state:
            torch.index_select(self.hs, 0, rows, out=stage[m * self.dim :])
        return stage


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Gathered host rows on ``device`` (synchronous path; through pinned memory on CUDA)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t
