"""The next batch's occurrence rows written in this step's tail, not at the next step's start
(issue 30, :data:`PREFILL`, off until measured on GPUs).

Why: with the exchange made early (:mod:`.ahead`) the next step starts with the lookup of its
occurrences' rows (:func:`.take.take_values`, ~25 us at batch 8192 x 26 on an H100), and a
delay at the step's start reaches the step whole (``bench/results/gpu/rank_delays_s19/``);
while this step's tail ends with the exchange's latency-bound kernels (the answer, the second
payload barrier, finish), which leave most SMs idle. So the rows stored here (own rows and
mirrors, final once the owner's update and the mirrors' local step ran, before the answer)
are copied into a fixed buffer on a stream of their own from the second barrier on, beside
barrier and finish (:func:`prefill_stored`); after finish, the occurrences of the rows finish
wrote (rows not stored here, from the reply; mirrors refreshed beyond the bound, into the
table) are copied again (:func:`prefill_redo`, finish marks them); the next step's lookup then
returns the buffer. The same bytes as :func:`.take.take_values` (the same copies, in the same
dtype): exact.

Order: nothing writes a stored row between the answer and the next step's lookup but finish's
refreshes, which the second pass overwrites (it waits for the first). The buffer holds this
step's rows until the first pass writes the next's, and this step's backward still reads them
(the first layer keeps its input, a view of the rows, for its deferred weight product): the
first pass also waits for everything the training stream had queued when the exchange began
(:func:`readers_done`), and no prefill runs while the first layer's products are held past
the exchange (``train/product_hold.py``). The buffer is one per
exchange buffer set (:class:`~.buffers.StaticExchange`), made outside any capture's order of
use: every step that exchanges early writes it, and a lookup uses it only when its batch says
so (``Batch.prefilled``) with the dtype and length it needs.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch

from hetgmp.embedding.batch import Batch
from hetgmp.embedding.kernels.launcher import launch, on_device, row_tiles

PREFILL = False


def prefill_stored_reference(
    table: torch.Tensor, blocks: torch.Tensor, slot: torch.Tensor, inv: torch.Tensor,
    out: torch.Tensor, w: int,
) -> None:  # fmt: skip
    """``out[o] = table[slot[inv[o]]]`` where the distinct row ``inv[o]`` is stored here (in
    the first ``2w`` of the ``3w`` blocks); other rows of ``out`` untouched."""
    ends = blocks[: 3 * w].cumsum(0)
    stored = torch.searchsorted(ends, inv.long(), right=True) < 2 * w
    o = stored.nonzero().squeeze(1)
    out[o] = table[slot[inv[o].long()].long()].to(out.dtype)


def prefill_redo_reference(
    table: torch.Tensor, src: torch.Tensor, redo: torch.Tensor, values: torch.Tensor,
    inv: torch.Tensor, out: torch.Tensor,
) -> None:  # fmt: skip
    """``out[o]`` again where ``redo[inv[o]]``: ``table[src]`` (``src >= 0``) or ``values``."""
    i = inv.long()
    o = (redo[i] != 0).nonzero().squeeze(1)
    s = src[i[o]]
    rows = torch.where((s >= 0)[:, None], table[s.clamp(min=0)], values[i[o]])
    out[o] = rows.to(out.dtype)


class PrefillRider:
    """One early exchange's prefill, riding its payload barriers (the protocol of
    :class:`hetgmp.comm.barrier_rider.BarrierRider`): ``pad`` the padded exchange (its
    current :class:`~.buffers.StaticExchange` runs the step), ``inv`` the batch's occurrences'
    distinct rows, ``dtype`` the rows' dtype (the last lookup's)."""

    def __init__(
        self, pad: Any, inv: torch.Tensor, dtype: torch.dtype, read: torch.cuda.Event | None
    ) -> None:
        self.pad, self.inv, self.dtype, self.read = pad, inv, dtype, read
        self.st: Any = None
        self._done: torch.cuda.Event | None = None

    def after_first(self) -> None:
        pass

    def after_second(self) -> None:
        pass

    def before_second(self) -> None:
        """The stored rows' pass, after what the exchange's stream has queued (the owner's
        update and the answer): on the buffer set's own stream on CUDA."""
        st = self.pad.static
        if self.st is not None or not _buffers(st, self.inv.numel(), self.dtype):
            return
        self.st = st
        dev = st.store.device
        if dev.type != "cuda":
            prefill_stored(st, self.inv)
            return
        stream = st.prefill_stream
        stream.wait_stream(torch.cuda.current_stream(dev))
        if self.read is not None:  # (this step's rows read by its backward: the buffer's)
            stream.wait_event(self.read)
        with torch.cuda.stream(stream):
            prefill_stored(st, self.inv)
        self._done = torch.cuda.Event()
        self._done.record(stream)

    def close(self) -> None:
        """(Once the exchange ran or failed) finish stops marking rows, and the first pass's
        stream is joined into the current one (a capture must join every stream it forked)."""
        if self.st is not None:
            self.st.prefill_redo = None
        if self._done is not None:
            torch.cuda.current_stream(self.st.store.device).wait_event(self._done)

    def complete(self, batch: Batch) -> None:
        """(After finish and :meth:`close`, on the exchange's stream) the second pass;
        ``batch`` then holds the rows (:attr:`Batch.prefilled`)."""
        st: Any = self.st
        if st is None or batch.static is not self.st:
            return
        prefill_redo(st, self.inv)
        batch.prefilled = st.prefill_rows[: self.inv.numel()]


def prefilled(primed: Any) -> bool:
    """Whether a primed batch (:class:`~.ahead.Primed`, or None) holds rows written in the
    last step's tail (the whole-step graphs are keyed by it)."""
    batch = getattr(primed, "batch", None)
    return batch is not None and batch.prefilled is not None


def readers_done(ctx: Any) -> tuple[bool, torch.cuda.Event | None]:
    """(Called on the training stream as an early exchange begins) whether the prefill may
    run (:data:`PREFILL`, and no product held past the exchange: ``ctx.mark_staged``), and an
    event after everything queued there (on CUDA): every reader of this step's rows."""
    if not PREFILL or ctx.mark_staged:
        return False, None
    if ctx.store.device.type != "cuda":
        return True, None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(ctx.store.device))
    return True, event


def rider(
    pad: Any, inv: torch.Tensor, dtype: torch.dtype | None, read: torch.cuda.Event | None
) -> PrefillRider | None:
    """A :class:`PrefillRider` where the prefill applies (the fused kernels over peer
    payloads, the lookup reading stored rows from the table), else None; ``read``:
    :func:`readers_done`'s event."""
    st = pad.static
    if dtype is None or st is None or not (st.fused and st.from_table and st.peer):
        return None
    return PrefillRider(pad, inv, dtype, read)


def _buffers(st: Any, n: int, dtype: torch.dtype) -> bool:
    """``st``'s prefill buffers (made once per buffer set, the first time: the rows for ``n``
    occurrences, the redo marks, a stream); False where they cannot serve this batch."""
    rows = getattr(st, "prefill_rows", None)
    if rows is None:
        dev = st.store.device
        if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return False  # (made in an eager step: no capture's pool, no kernel compiled there)
        st.prefill_rows = torch.empty(n, st.d, dtype=dtype, device=dev)
        st.prefill_marks = torch.zeros(st.cap.u, dtype=torch.int8, device=dev)
        st.prefill_stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        rows = st.prefill_rows
    if rows.dtype != dtype or rows.shape[0] < n or st.prefill_marks.numel() < st.cap.u:
        return False
    st.prefill_redo = st.prefill_marks  # (finish marks the rows it writes: kernels.finish)
    return True


def prefill_stored(st: Any, inv: torch.Tensor) -> None:
    """The stored rows' pass into ``st.prefill_rows`` (the fused kernels only: finish marks
    what the second pass redoes; :func:`prefill_stored_reference` is what it must equal)."""
    table, out, n = st.store.weight_full, st.prefill_rows, inv.numel()
    triton, k = _kernels()
    block_r, block_d = row_tiles(triton, st.d)
    with on_device(table):
        launch(
            k.prefill_stored_kernel, (max(1, triton.cdiv(n, block_r)),),
            (table, st.blocks, st.slot, inv, out, n),
            {"W": st.w, "B3": triton.next_power_of_2(3 * st.w), "D": st.d, "BLOCK_R": block_r,
             "BLOCK_D": block_d},
        )  # fmt: skip


def prefill_redo(st: Any, inv: torch.Tensor) -> None:
    """The second pass: the occurrences of the rows finish wrote (marked in
    ``st.prefill_marks``)."""
    table, out, n = st.store.weight_full, st.prefill_rows, inv.numel()
    args = (table, st.src, st.prefill_marks, st.values, inv, out)
    triton, k = _kernels()
    block_r, block_d = row_tiles(triton, st.d)
    with on_device(table):
        launch(
            k.prefill_redo_kernel, (max(1, triton.cdiv(n, block_r)),), (*args, n),
            {"D": st.d, "BLOCK_R": block_r, "BLOCK_D": block_d},
        )  # fmt: skip


@functools.lru_cache(maxsize=1)
def _kernels() -> tuple[Any, Any]:
    """``(triton, prefill_triton)``, imported once (Triton only where it runs)."""
    kt = importlib.import_module("hetgmp.embedding.padded.prefill_triton")
    return importlib.import_module("triton"), kt
