"""Diagnosis only: a fixed delay inserted at one point of the multi-GPU step, to learn whether
that point lies on the path the step waits for (``switches.py dilate:POINT:US``).

Why: on 2 H100s (session 17) cutting ~10 us from the exchange's chain and ~20 us from the
dense path at once moved the step by nothing, though a kernel timeline under CUPTI put both on
its critical path; and the time each rank spends inside each meeting (``barrier_waits.py``,
session 18) is well above the meetings' own cost on both ranks. A delay of D us that adds D us
to the step marks a point on the critical path; one that adds nothing marks a point with at
least D us of slack (the causal-profiling idea). The delay is ``torch.cuda._sleep`` (one
thread spinning for a number of clock cycles: it takes no SM's worth of resources, so what it
shows is the path, not contention), launched on the stream current at that point, inside
the captured graph like every other kernel there. Its values are right (nothing is left out),
so its AUC equals the undelayed run's.

Points: ``pack`` (the exchange's chain, before pack), ``finish`` (the chain, before finish),
``chainend`` (the chain, after finish), ``dense`` (the dense path, before the gradients'
sum over ranks), ``adam`` (the dense path, before Adam), ``sum`` (before the rows' gradient sum), ``presync`` (before the pre-sync
gradient part), ``counts`` (before the counts phase beside the forward), ``plan`` (before
the next batch's plan, on the plan's stream); and two to calibrate and to find what ends the
step: ``start`` (on the main stream before the step's first work: nothing runs beside it, so
the step grows by the delay's true length) and ``end`` (on the main stream after the step
returns, before the capture joins the other streams: the full delay only if the main stream
ends last). ``POINT:US:RANK`` delays on rank RANK only: the step grows by the delay if that
rank's path there is the later one, and by less if the other rank arrives at the next meeting
later anyway (per rank, which of them the step waits for).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

CYCLES_PER_US = 1755  # (H100 SXM under load; the same for every point, so ratios hold)


# (POINT:US:RANK: only that rank delays, the other's slack then shows: is one rank later)
ONLY_RANK: int | None = None


def _delay(us: float) -> None:
    import torch

    if ONLY_RANK is not None and int(os.environ.get("RANK", "0")) != ONLY_RANK:
        return
    if torch.cuda.is_available():  # (a CPU smoke run: no delay)
        torch.cuda._sleep(int(us * CYCLES_PER_US))


Hook = Callable[[], None] | None


def _wrap(owner: Any, name: str, before: Hook, after: Hook) -> None:
    """``owner.name`` with ``before()`` before it runs and ``after()`` once it returned."""
    fn = getattr(owner, name)

    def hooked(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before()
        out = fn(*args, **kwargs)
        if after is not None:
            after()
        return out

    setattr(owner, name, hooked)


def _in_step(key: str, before: Hook, after: Hook) -> None:
    from hetgmp.embedding.padded import buffers

    step = buffers.StaticExchange._step

    def hooked(st: Any, segment: Callable[[str, Callable[[], None]], Any]) -> None:
        def seg(k: str, fn: Callable[[], None]) -> Any:
            if k != key:
                return segment(k, fn)

            def run() -> None:
                if before is not None:
                    before()
                fn()
                if after is not None:
                    after()

            return segment(k, run)

        step(st, seg)

    setattr(buffers.StaticExchange, "_step", hooked)  # noqa: B010 (a diagnosis's patch)


# the points (module docstring) where ``hook`` can run work; "chainend" is after "finish"
POINTS = ("dense", "adam", "sum", "presync", "counts", "start", "end", "plan", "pack", "finish")


def hook(point: str, before: Hook, after: Hook) -> None:
    """``before()`` / ``after()`` around ``point`` (one of :data:`POINTS`; "end": the main
    stream after the step, so ``after`` alone) in every step from now on (on the stream
    current there: inside a captured graph, recorded in it)."""
    from hetgmp.embedding.padded import buffers, graphs, kernels
    from hetgmp.train import dense_sync, flat_adam, inputs_ahead, step

    wrapped = {  # point -> (owner, function)
        "dense": (dense_sync.GradBucket, "all_reduce"),
        "adam": (flat_adam.FlatAdam, "step"),
        "sum": (buffers.StaticExchange, "sum_grad"),
        "presync": (kernels, "presync_values"),
        "counts": (buffers.StaticExchange, "presync_counts_early"),
        "start": (inputs_ahead.InputsAhead, "mark_start"),
        "end": (step.TrainStep, "__call__"),
        "plan": (graphs.PrepRing, "fill"),
    }
    if point in ("pack", "finish"):
        _in_step(point, before, after)
    elif point in wrapped:
        owner, name = wrapped[point]
        _wrap(owner, name, before, after)
    else:
        raise SystemExit(f"dilations: no point {point!r}")


def apply(spec: str) -> None:
    """Delay ``POINT:US[:RANK]`` (see the module docstring; RANK: on that rank only) in every
    step from now on."""
    global ONLY_RANK
    point, _, rest = spec.partition(":")
    us_text, _, rank_text = rest.partition(":")
    us = float(us_text or 40)
    ONLY_RANK = int(rank_text) if rank_text else None

    def delay() -> None:
        _delay(us)

    if point == "chainend":
        hook("finish", None, delay)
    elif point == "end":
        hook("end", None, delay)
    else:
        hook(point, delay, None)
