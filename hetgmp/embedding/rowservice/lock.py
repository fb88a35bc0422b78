"""The lock the training thread and the row service's thread share over the table
(:class:`TableLock`).

On the CPU it is a plain reentrant lock. On CUDA the rows, versions and optimizer state stay on
the device, and each thread enqueues its work on the table on its own stream (the training
thread on its current stream, the service on a stream of its own), so the lock also orders the
streams: whoever takes it makes its stream wait, through an event, for what the last holder
enqueued (no device-wide synchronization).
"""

from __future__ import annotations

import threading
from typing import Any

import torch


class TableLock:
    """The table's reentrant lock, shared by the training thread and the service thread; on
    CUDA it also orders their streams (see the module docstring). Use it as a context
    manager; :meth:`fence` only orders (the current stream waits for the last holder)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._lock = threading.RLock()
        self._cuda = device.type == "cuda"
        self._depth = 0  # (changed by the holder only)
        self._last: tuple[int, Any] | None = None  # (stream handle, event) of the last release
        self._events: dict[int, Any] = {}  # one event per stream, re-recorded at each release

    def __enter__(self) -> TableLock:
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1 and self._cuda and self._last is not None:
            stream = torch.cuda.current_stream(self.device)
            if self._last[0] != stream.cuda_stream:  # (same stream: already in order)
                stream.wait_event(self._last[1])
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._depth == 1 and self._cuda:
                stream = torch.cuda.current_stream(self.device)
                event = self._events.get(stream.cuda_stream)
                if event is None:
                    event = self._events[stream.cuda_stream] = torch.cuda.Event()
                # (a wait enqueued earlier keeps waiting for the record it saw: CUDA semantics)
                event.record(stream)
                self._last = (stream.cuda_stream, event)
        finally:
            self._depth -= 1
            self._lock.release()

    def fence(self) -> None:
        """Order the current stream after everything enqueued on the table so far."""
        with self:
            pass
