"""The host tier's eviction order (:mod:`.tiered`): CLOCK (second chance) over the cache slots,
so a residency decision costs in proportion to the rows it moves, never to the cache's size.

Why: the least-recently-used order it replaces made a few passes over every cache slot per
decision (selection of the oldest last-use times): tens of ms per step at 3.4M slots (a 10 %
cache of a 33.8M-row table), many times a GPU step. Here:

* a *reference bit* per slot, set for every slot a batch hits (a row used again is kept);
  a slot just loaded starts without it (a row used once goes first: a cold tail does not
  push hot rows out);
* a *hand* that moves down the slots (the initial residents sit hottest first by slot, so
  the coldest go first), wrapping at 0. A decision needing ``k`` victims looks at a window of
  slots below the hand: the unreferenced, unguarded ones are taken (in hand order), the
  referenced ones passed lose their bit (their second chance), guarded ones are skipped; the
  window doubles while short. The hand stops after the last victim.

Cost: every slot the hand passes is taken, or loses a bit a hit set (at most a batch's
distinct rows per decision), or is guarded (the held and staged batches': passed at most
once per turn of the hand), so the slots passed per decision are amortized O(batch); the last
window's overshoot is at most twice the slots it needed plus :data:`WINDOW`. Counted in
:attr:`Clock.scanned`. Guarded slots (rows a step still needs) are never taken: the guard is
a mask set and cleared by index for each decision (never a pass over the cache).
"""

from __future__ import annotations

import torch

from hetgmp.embedding.tier_host import positions

WINDOW = 256  # the smallest window of slots the hand looks at (a few victims: one pass)


class Clock:
    """The eviction order over ``budget`` cache slots (see the module docstring)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.ref = torch.zeros(budget, dtype=torch.bool)  # used since the hand last passed
        self.guard = torch.zeros(budget, dtype=torch.bool)  # never a victim (one decision)
        self.hand = budget - 1  # the next slot looked at (moving down)
        self.scanned = 0  # slots the hand's windows looked at, in all

    def used(self, slots: torch.Tensor) -> None:
        """``slots`` (host int64) were hit: they get their second chance."""
        self.ref.index_fill_(0, slots, True)

    def loaded(self, slots: torch.Tensor) -> None:
        """``slots`` (host int64) now hold rows just loaded: no reference yet."""
        self.ref.index_fill_(0, slots, False)

    def victims(self, k: int, guard: torch.Tensor) -> torch.Tensor:
        """``k`` slots (host int64, in hand order), none in ``guard`` (host int64 slots, may
        repeat). The caller checked that at least ``k`` slots are not guarded (else the hand
        would go round for ever)."""
        if k <= 0:
            return torch.empty(0, dtype=torch.int64)
        self.guard.index_fill_(0, guard, True)  # (index_*: cheaper than [] on the CPU)
        got: list[torch.Tensor] = []
        want, width = k, max(2 * k, WINDOW)
        while want > 0:
            width = min(width, self.budget)
            runs = self._runs(width)  # (slices, not an index per slot: cheaper on the CPU)
            free = ~torch.cat([(self.ref[a:b] | self.guard[a:b]).flip(0) for a, b in runs])
            pos = positions(free)  # (window positions, in hand order)
            passed = width
            if pos.numel() >= want:  # (the hand stops after the last one taken)
                pos = pos[:want]
                passed = int(pos[-1]) + 1
            self.scanned += width
            left = passed
            for a, b in runs:  # (the slots passed: their second chance used)
                n = min(b - a, left)
                self.ref[b - n : b] = False
                left -= n
            taken = (self.hand - pos).remainder_(self.budget)
            self.guard.index_fill_(0, taken, True)  # (a later window may wrap onto them)
            got.append(taken)
            want -= taken.numel()
            self.hand = (self.hand - passed) % self.budget
            width *= 2
        out = torch.cat(got)
        self.guard.index_fill_(0, guard, False)
        self.guard.index_fill_(0, out, False)
        return out

    def _runs(self, width: int) -> list[tuple[int, int]]:
        """The ``width`` slots from the hand down (wrapping at 0) as slices ``[a, b)`` in
        hand order, each read from ``b - 1`` down to ``a``."""
        top = self.hand + 1
        if width <= top:
            return [(top - width, top)]
        return [(0, top), (self.budget - (width - top), self.budget)]
