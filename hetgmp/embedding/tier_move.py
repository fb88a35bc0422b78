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
  3. write-back: the updated victims' rows (+ state, versions: :func:`columns`) gathered on
     the device and copied into a pinned buffer (non-blocking); the host scatters them into host memory only after the
     move's event (:meth:`RowMover.settle`, before any later read of host rows);
  4. load: the missed rows gathered on the host (``index_select`` into one pinned staging
     buffer: column after column), one non-blocking copy, then ``index_copy_`` into the cache;
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


def columns(
    weight: torch.Tensor, state: torch.Tensor, version: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """A tier's per-row tensors as 2-D float32 views a move copies alike: ``weight [N, D]``,
    ``state`` ``[N]`` as ``[N, 1]`` (absent when empty: SGD) and int64 ``version [N]`` as
    ``[N, 2]`` float32 lanes (bits copied, never converted; several ranks' owned rows)."""
    cols = [weight]
    if state.numel():
        cols.append(state.view(-1, 1))
    if version is not None:
        cols.append(version.view(torch.float32).view(-1, 2))
    return cols


class RowMover:
    """Carries out :class:`Move` s for one tier's tensors (see the module docstring).
    ``host`` / ``cache``: the same :func:`columns` of the host rows (pinned for CUDA) and of
    the device cache; ``slot_of [N]`` on ``device`` (on CPU the host map itself, already
    updated by the decision)."""

    def __init__(
        self, host: list[torch.Tensor], cache: list[torch.Tensor], slot_of: torch.Tensor, *,
        device: torch.device, overlap: bool,
    ) -> None:  # fmt: skip
        self.host, self.cache, self.slot_of = host, cache, slot_of
        self.widths = [int(c.shape[1]) for c in host]
        self.width = sum(self.widths)  # float32 values a row moves (all columns)
        self.device = device
        self.overlap = overlap and device.type == "cuda"
        self.copy: torch.cuda.Stream | None = torch.cuda.Stream(device) if self.overlap else None
        self._last: Move | None = None  # the last overlapped move (its event, its write-back)
        self._wb_pinned: torch.Tensor | None = None  # its write-back's columns, pinned

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
            for col, part in zip(self.host, self._split(buf, n), strict=True):
                col[last.wb_rows] = part
        self._wb_pinned = None

    def _split(self, flat: torch.Tensor, n: int) -> list[torch.Tensor]:
        """``flat`` (``n`` rows of every column, column after column) as ``[n, width]`` views."""
        return [p.view(n, w) for p, w in zip(flat.split([n * w for w in self.widths]),
                                             self.widths, strict=True)]  # fmt: skip

    # ------------------------------------------------------------------ CPU / synchronous
    def write_back_now(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Cache ``slots``' values into host ``rows`` (host int64), synchronously."""
        dev = slots.to(self.device)  # (index_*: cheaper than [] on the CPU; distinct rows)
        for h, c in zip(self.host, self.cache, strict=True):
            h.index_copy_(0, rows, c.index_select(0, dev).cpu())

    def load_now(self, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Host ``rows``' values into cache ``slots`` (host int64), synchronously."""
        dev = slots.to(self.device)
        for h, c in zip(self.host, self.cache, strict=True):
            c.index_copy_(0, dev, _to_device(h.index_select(0, rows), self.device))

    def _run_now(self, move: Move) -> None:
        """The move in the caller's stream: write-back, then load (into the same slots)."""
        if move.wb_slots.numel():
            self.write_back_now(move.wb_slots, move.wb_rows)
        if move.load_rows.numel():
            self.load_now(move.load_rows, move.load_slots)
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
        with torch.cuda.stream(self.copy):
            self.copy.wait_event(ready)
            idx_dev = idx.to(self.device, non_blocking=True)
            wb_slots, load_slots = idx_dev[:w], idx_dev[w : w + m]
            load_rows, evicted = idx_dev[w + m : w + 2 * m], idx_dev[w + 2 * m :]
            if w:  # write-back before the loads reuse the slots (same stream: in order)
                got = torch.empty(w * self.width, dtype=torch.float32, device=self.device)
                for c, part in zip(self.cache, self._split(got, w), strict=True):
                    part.copy_(c.index_select(0, wb_slots))
                self._wb_pinned = torch.empty(w * self.width, dtype=torch.float32, pin_memory=True)
                self._wb_pinned.copy_(got, non_blocking=True)
            if stage is not None:
                rows = stage.to(self.device, non_blocking=True)
                for c, part in zip(self.cache, self._split(rows, m), strict=True):
                    c.index_copy_(0, load_slots, part)
            if e:
                self.slot_of.index_fill_(0, evicted, -1)
            if m:
                self.slot_of.index_copy_(0, load_rows, load_slots)
            move.done = torch.cuda.Event()
            move.done.record(self.copy)
        self._last = move

    def _stage_loads(self, rows: torch.Tensor) -> torch.Tensor:
        """The missed rows (column after column) gathered on the host into one pinned buffer."""
        m = rows.numel()
        stage = torch.empty(m * self.width, dtype=torch.float32, pin_memory=True)
        for h, part in zip(self.host, self._split(stage, m), strict=True):
            torch.index_select(h, 0, rows, out=part)
        return stage


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Gathered host rows on ``device`` (synchronous path; through pinned memory on CUDA)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t
