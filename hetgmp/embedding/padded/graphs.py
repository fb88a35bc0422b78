"""CUDA graphs of the padded transport: :class:`GraphCache` (run eagerly, capture at the second
use, replay from then on) and :class:`PrepRing` (a batch's preprocessing into one of its fixed
slots, so its outputs keep their addresses and later graphs can read them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from hetgmp.embedding.kernels.prep import PlanArrays
from hetgmp.embedding.padded.fields import SLOTS


class GraphCache:
    """Per key: run a function eagerly the first time (and always when ``enabled`` is false:
    CPU, or ``cuda_graphs`` off; and whenever the caller says its inputs are not at fixed
    addresses: ``capturable`` false), capture it as a CUDA graph at its second use (the first
    also compiled the Triton kernels) and replay it from then on. The captured call's return
    value is kept: its tensors are the graph's outputs, rewritten in place by every replay.
    At most ``limit`` graphs are kept (keys that hold an address, e.g. of an incoming gradient,
    could otherwise pile up graphs and their memory pools): the oldest goes first."""

    def __init__(self, enabled: bool, *, limit: int = 16) -> None:
        self.enabled, self.limit = enabled, limit
        # run every function plainly, neither capturing nor replaying (set while an enclosing
        # graph captures the whole step: graphs do not nest)
        self.plain = False
        self._graphs: dict[object, torch.cuda.CUDAGraph] = {}
        self._out: dict[object, Any] = {}
        self._warm: set[object] = set()

    def __len__(self) -> int:
        """The number of captured graphs."""
        return len(self._graphs)

    def clear(self) -> None:
        """Drop every captured graph (and its outputs); the next use starts over (warm-up)."""
        self._graphs.clear()
        self._out.clear()
        self._warm.clear()

    def run(
        self, key: object, fn: Callable[[], Any], *, capturable: bool = True
    ) -> tuple[Any, bool]:
        """``(fn's result, whether it came from a replayed graph)``."""
        if self.plain:
            return fn(), False
        if capturable and key in self._graphs:
            self._graphs[key].replay()
            return self._out[key], True
        if not (self.enabled and capturable) or key not in self._warm:
            if capturable:
                if len(self._warm) >= 4 * self.limit:
                    self._warm = set(self._graphs)
                self._warm.add(key)
            return fn(), False
        if len(self._graphs) >= self.limit:
            # (the device may still run the oldest graph: its memory pool must outlive it)
            torch.cuda.synchronize()
            old = next(iter(self._graphs))
            del self._graphs[old], self._out[old]
        out: list[Any] = []
        g = torch.cuda.CUDAGraph()
        # thread_local: other threads (NCCL's watchdog) may call CUDA while this one captures
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            out.append(fn())
        self._graphs[key], self._out[key] = g, out[0]
        g.replay()
        return out[0], True


class PrepRing:
    """Fixed slots (:data:`~.fields.SLOTS`) for a batch's preprocessed ids (``prepare(ids) ->
    prep``), used in turn: the batch being trained reads one, the last batch's (its gradient
    not pushed yet: the next exchange reads its arrays) another, the next batch is prepared
    into the third (in a step that reads one step ahead, :mod:`.ahead`, while this one
    trains). On CUDA with ``graphs`` each slot's
    preprocessing is captured at its second use; from then on the slot's outputs stay at fixed
    addresses (``static``), which is what lets the pre-sync segment be captured too."""

    def __init__(
        self, shape: tuple[int, int], device: torch.device, prepare: Callable[..., Any],
        *, graphs: bool, writes_into: bool = False,
    ) -> None:  # fmt: skip
        self.ids = [torch.zeros(shape, dtype=torch.int64, device=device) for _ in range(SLOTS)]
        self.prepare = prepare
        self._graphs = GraphCache(graphs)  # one per slot
        self.last = 1  # the slot of the batch consumed last
        # ``fixed``: each slot's outputs copied into buffers of its own, so they keep their
        # addresses whoever ran the preparation (its graph, an eager step, or a whole-step
        # graph, whose allocations live in that graph's pool)
        self.fixed = False
        # (``prepare(ids, arrays)`` writes the plan into given arrays: a fixed slot's buffers
        # are then written in place, not copied, once the slot's first plan made them)
        self.writes_into = writes_into
        self._out: list[Any] = [None] * SLOTS

    def release(self) -> None:
        """Drop the captured graphs."""
        self._graphs.clear()

    def fill(self, ids: torch.Tensor) -> tuple[Any, int, bool]:
        """Prepare ``ids`` into the slot after the last consumed: ``(prep, slot, static)``."""
        s = self.next_slot
        self.ids[s].copy_(ids)
        out = self._out[s]
        if self.fixed and out is not None and self.writes_into:
            # (the plan written straight into the slot's buffers: no copies, ~12 us of the
            # 2-GPU step's plan stream at batch 8192 on 2 H100s)
            arrays = PlanArrays(**{f: getattr(out, f) for f in PlanArrays._fields})
            self._graphs.run(("into", s), lambda: self.prepare(self.ids[s], arrays))
            return out, s, True
        prep, static = self._graphs.run(s, lambda: self.prepare(self.ids[s]))
        if not self.fixed:
            return prep, s, static
        if out is None:
            out = self._out[s] = dataclasses.replace(
                prep, **{f: getattr(prep, f).clone() for f in PlanArrays._fields}
            )
        else:
            for f in PlanArrays._fields:
                getattr(out, f).copy_(getattr(prep, f))
        return out, s, True

    @property
    def next_slot(self) -> int:
        """The slot the next :meth:`fill` uses."""
        return (self.last + 1) % SLOTS

    @property
    def plain(self) -> bool:
        return self._graphs.plain

    @plain.setter
    def plain(self, value: bool) -> None:
        self._graphs.plain = value
