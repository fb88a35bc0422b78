"""Where a rank's RPC messages meet its device: the host buffers they pass through
(:class:`HostStage`), one set per thread.

Arrays of any device go on the wire from host memory and come off it into the device's. On the
CPU messages are read into fresh host buffers. On CUDA they go through grow-only pinned host
buffers: arrays to send are copied device -> pinned (non-blocking, then one wait on an event of
this thread's stream) and the wire copies them into the ZeroMQ message; a message received is
laid out in a pinned buffer and copied to the device in one non-blocking copy, and the buffer
is written again only once an event says that copy has finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

ALIGN = 64  # byte offset of every array in a staging buffer (any dtype view is aligned)
# Reuse buffers on the CPU too (tests: the CUDA path's buffer logic in real CPU runs).
REUSE_ON_CPU = False


def _round_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def layout(nbytes: Sequence[int]) -> tuple[list[int], int]:
    """Aligned offsets of arrays of ``nbytes`` bytes laid out one after the other, and the
    total size."""
    offs, end = [], 0
    for n in nbytes:
        offs.append(end)
        end += _round_up(n)
    return offs, end


class HostStage:
    """Host buffers between the wire and ``device``, for ONE thread (not thread-safe).

    ``reuse`` (default: on CUDA, or with ``REUSE_ON_CPU``) keeps grow-only buffers (pinned on
    CUDA) instead of fresh ones per message; on the CPU it is for tests of the buffer logic."""

    def __init__(self, device: torch.device, reuse: bool | None = None) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.reuse = (self.cuda or REUSE_ON_CPU) if reuse is None else bool(reuse)
        self._in = self._host(0)
        self._in_used = 0  # bytes of ``_in`` handed out since :meth:`begin_receive`
        self._in_pending = False  # a copy out of ``_in`` may still run (``_in_done`` says)
        self._in_done = torch.cuda.Event() if self.cuda else None
        self._out = self._host(0)
        self._out_done = torch.cuda.Event() if self.cuda else None
        self.grown = 0  # buffer (re)allocations, for tests and diagnostics

    def _host(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.cuda and nbytes > 0)

    def _grow(self, old: torch.Tensor, need: int) -> torch.Tensor:
        self.grown += 1
        return self._host(max(need, 2 * old.numel()))

    # ------------------------------------------------------------------ device -> wire
    def to_host(self, messages: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        """Host copies of every message's arrays, for :func:`.wire.pack`; valid until the
        next call (the wire copies them into the ZeroMQ message at once). Without ``reuse``
        the host arrays themselves (contiguous)."""
        flat = [t for m in messages for t in m.values()]
        if not self.reuse or not flat:  # (an acknowledgement carries no array: no wait)
            return [
                {k: plain(t).cpu() if t.is_cuda else plain(t) for k, t in m.items()}
                for m in messages
            ]
        offs, total = layout([t.numel() * t.element_size() for t in flat])
        if total > self._out.numel():
            self._out = self._grow(self._out, total)
        out, it = [], iter(zip(flat, offs, strict=True))
        for m in messages:
            host = {}
            for k in m:
                t, off = next(it)
                dst = _view(self._out, off, t.dtype, tuple(t.shape))
                src = t.detach() if t.requires_grad else t  # (copy_ takes any layout)
                host[k] = dst.copy_(src, non_blocking=self.cuda)
            out.append(host)
        if self._out_done is not None:  # (CUDA; waits for this thread's stream only)
            self._out_done.record(torch.cuda.current_stream(self.device))
            self._out_done.synchronize()
        return out

    # ------------------------------------------------------------------ wire -> device
    def begin_receive(self) -> None:
        """Start a new batch of received messages: the earlier ones' host bytes are no longer
        needed (on CUDA: once their copies to the device have finished)."""
        if self._in_pending and self._in_done is not None:
            self._in_done.synchronize()
            self._in_pending = False
        self._in_used = 0

    def receive(
        self, specs: list[tuple[str, torch.dtype, tuple[int, ...]]], raws: Sequence[Any]
    ) -> dict[str, torch.Tensor]:
        """The arrays of one message (``specs``: name, dtype, shape; ``raws``: their bytes,
        sizes checked by the caller) on the device; on CUDA the copy to the device is
        non-blocking on the current stream (later work on that stream sees the data)."""
        if not specs:
            return {}
        sizes = [_nbytes(dtype, shape) for _, dtype, shape in specs]
        offs, total = layout(sizes)
        host = self._take_in(total)
        hv = host.numpy()
        for off, n, raw in zip(offs, sizes, raws, strict=True):
            if n:
                hv[off : off + n] = np.frombuffer(raw, dtype=np.uint8, count=n)
        dev = host
        if self._in_done is not None:  # (CUDA)
            dev = host.to(self.device, non_blocking=True)
            self._in_done.record(torch.cuda.current_stream(self.device))
            self._in_pending = True
        return {
            name: _view(dev, off, dtype, shape)
            for (name, dtype, shape), off in zip(specs, offs, strict=True)
        }

    def _take_in(self, total: int) -> torch.Tensor:
        if not self.reuse:
            return self._host(total)
        if self._in_used + total > self._in.numel():
            # (views handed out earlier keep the old buffer alive; pinned memory freed after a
            # non-blocking copy is reused by torch's host allocator only once the copy is done)
            self._in = self._grow(self._in, total)
            self._in_used = 0
        start = self._in_used
        self._in_used += total
        return self._in[start : start + total]


def plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached and contiguous, with no torch call where none is needed: each one drops
    the GIL, and a service thread waits to get it back (see :mod:`.service`)."""
    if t.requires_grad:
        t = t.detach()
    return t if t.is_contiguous() else t.contiguous()


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _view(buf: torch.Tensor, off: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """``buf[off:]`` (uint8, ``off`` aligned) seen as an array of ``dtype`` and ``shape``."""
    n = _nbytes(dtype, shape)
    flat = buf[off : off + n].view(dtype)
    return flat if len(shape) == 1 else flat.view(shape)  # (one torch call fewer: 1-D arrays)
