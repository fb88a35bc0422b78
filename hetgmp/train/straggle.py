"""``--straggle RANK:FACTOR``: a benchmark facility that makes one rank a straggler.

After each of its training steps, rank ``RANK`` waits ``(FACTOR - 1)`` times its own step time
(the median of its last steps, measured without the injected wait; on CUDA after a device
synchronization), so it runs at about ``1 / FACTOR`` of its natural speed. It applies in both
``--sync`` modes: under ``collective`` every rank then moves at the straggler's pace, under
``async`` only the straggler does (within ``--max-lag``).

The wait either sleeps (``sleep``, the default: the rank's core is free meanwhile, as when a
slow GPU or a remote stall holds a rank up) or spins (``RANK:FACTOR:spin``: the rank keeps its
core busy, as a rank on a slower or contended CPU; fairer on a host with fewer cores than ranks,
where a sleeping straggler would hand its core to the others). The spin runs in the native
extension with the GIL released, as a slow step's torch kernels do: a Python busy loop would
hold the GIL and starve the rank's async row service thread, coupling every peer to the
straggler (measured: 2x straggler, 4 ranks on 16 cores, async kept 0.51 of its speed).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import deque
from typing import TYPE_CHECKING

from hetgmp.native import native_function

if TYPE_CHECKING:  # (the option parsers import this module: --help must not import torch)
    import torch

WINDOW = 16  # steps of the running median
WAITS = ("sleep", "spin")


@dataclasses.dataclass(frozen=True)
class Straggle:
    """Which rank straggles, by what factor, and how it waits."""

    rank: int
    factor: float
    wait: str = "sleep"


def parse_straggle(text: str) -> Straggle | None:
    """``""`` -> None; ``"RANK:FACTOR[:sleep|spin]"`` -> :class:`Straggle`; ``ValueError`` with
    the expected form otherwise."""
    if not text:
        return None
    form = "expected RANK:FACTOR or RANK:FACTOR:spin (e.g. 1:2), RANK >= 0, FACTOR >= 1"
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"--straggle {text!r}: {form}")
    try:
        rank, factor = int(parts[0]), float(parts[1])
    except ValueError:
        raise ValueError(f"--straggle {text!r}: {form}") from None
    wait = parts[2] if len(parts) == 3 else "sleep"
    if rank < 0 or not math.isfinite(factor) or factor < 1 or wait not in WAITS:
        raise ValueError(f"--straggle {text!r}: {form}")
    return Straggle(rank, factor, wait)


def straggle_ok(text: str) -> bool:
    """The config check of ``--straggle``."""
    try:
        parse_straggle(text)
    except ValueError:
        return False
    return True


class Straggler:
    """Times this rank's steps and, on the straggling rank, waits after each one."""

    def __init__(self, spec: Straggle | None, rank: int, world: int, device: torch.device) -> None:
        if spec is not None and spec.rank >= world:
            raise ValueError(
                f"--straggle {spec.rank}:{spec.factor:g}: there is no rank {spec.rank} in a run "
                f"of {world} rank(s)"
            )
        self.spec = spec
        self.active = spec is not None and spec.rank == rank and spec.factor > 1
        self.device = device
        self.times: deque[float] = deque(maxlen=WINDOW)
        self.waited_s = 0.0  # injected wait in total
        self._t0 = 0.0

    def begin(self) -> None:
        """A step starts."""
        if self.active:
            self._sync()
            self._t0 = time.perf_counter()

    def end(self) -> None:
        """The step ended: measure it, then wait ``(factor - 1)`` times the running median."""
        if not self.active:
            return
        assert self.spec is not None
        self._sync()
        self.times.append(time.perf_counter() - self._t0)
        delay = (self.spec.factor - 1.0) * statistics.median(self.times)
        if self.spec.wait == "sleep":
            time.sleep(delay)
        else:  # (native, without the GIL: a Python loop would starve this rank's other threads)
            native_function("spin_for")(delay)
        self.waited_s += delay

    def _sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
