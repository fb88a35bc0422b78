"""Optional per-phase wall-clock split of the embedding step (for bench/, off by default).

When enabled, every ``mark`` synchronises the device first (so GPU time lands in the phase that
queued it); when disabled ``mark`` does nothing, so the training path has no extra host syncs.
"""

from __future__ import annotations

import time

import torch

PHASES = ("unique", "exchange", "gather", "update")


class PhaseTimer:
    """Accumulates seconds per phase between consecutive ``mark`` calls."""

    def __init__(self, device: torch.device, enabled: bool = False) -> None:
        self.device, self.enabled = device, enabled
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._last = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        if self.enabled:
            self._sync()
            self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        if self.enabled:
            self._sync()
            now = time.perf_counter()
            self.seconds[phase] += now - self._last
            self._last = now

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
