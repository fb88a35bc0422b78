"""Plans, or reads, one step ahead: the next batch's plan (or its whole exchange) while this
batch's dense part computes.

**Planning ahead** (``PLAN_AHEAD``, on by default at every bound): the next batch's plan (its
unique ids in block order, slots and owners: :class:`~hetgmp.embedding.batch.BatchPlanner`,
~0.15 ms of kernels at batch 8192 on an H100, the biggest part of the multi-rank step's own
work) is made on a side stream while this batch trains. A plan reads only the ids and the
placement, which no step changes, so the step is exactly the strict one (``--bound 0`` keeps
its equality to one process) and every read keeps ``--bound``: only the order of kernels on the
device changes.

**Exchanging early** (``EXCHANGE_EARLY``, on with planning ahead): the next batch's exchange
(this batch's pushes, the owners' updates and answers, its rows back) starts as soon as this
batch's backward has summed its rows' gradient, on the side stream of that sum, while the
dense gradients' all-reduce and the dense optimizer run on the main stream (on a communicator
of their own). It reads the table after every update the strict order applies first, so it
is exact too; the next step takes its rows and goes straight to the model. Anything that runs
a step of the table in between (an evaluation, a flush, a checkpoint) drops them: the
exchange applied this batch's gradient and only read, so dropping loses nothing. Its counts
phase (the sizes table and all-to-all, which read no gradient) runs earlier still, with the
plan (:mod:`.presync_step`). Measured on 2 H100s with the user's command: 1.33x (strict) ->
1.48x of one GPU at batch 8192, 1.67x -> 1.75x at 65536, AUC equal
(``bench/results/gpu/early_counts/``).

**Reading ahead** (``ENABLED``, off by default; a diagnosis): the next batch's whole exchange,
its reads included, runs ahead. It relaxes ``--bound`` by one step (below), so it is never
the default: a hot row mirrored here gets thousands of its owner's updates per step at batch
8192, all missed by a read answered before them.

Why reading ahead was tried (it was the default for a day): on 2 H100s the padded step's exchange (~40 small kernels and three collectives, ~0.3 ms
at batch 8192) sat on the critical path in front of the model (2-GPU step 1.03 ms vs one GPU's
0.61, 2026-11-26); the bytes were not the limit. With ``--bound`` >= 1 the next batch's
exchange (its plan, the sizes exchange, the queries and the last batch's pushes out, the
owners' updates and answers, mirror refreshes back) runs on a side CUDA stream of the same
captured step, under this batch's forward and backward: TorchRec's semi-synchronous pipeline
and HugeCTR's overlapped embedding do the same.

What it means for reads (the **step lag**): the rows step ``t + 1`` reads are answered while
step ``t`` computes, before step ``t``'s gradient exists. The rows stored here (own rows and
mirrors) then take step ``t``'s gradient at the end of step ``t`` and are read again from the
table when step ``t + 1`` takes its primed rows (:mod:`.local_now`), so they miss nothing of
this rank's; rows stored elsewhere, and the peers' pushes to rows owned here, arrive one step
later than without reading ahead, beyond what ``--bound`` lets a mirror miss (the per-row
rule is unchanged, :mod:`hetgmp.embedding.protocol`). ``--bound 0`` never reads ahead (it
keeps the strict order and its equality to one process). Every gradient is applied exactly
once. Counted: ``graph_replays_ahead`` in the run's results (steps whose rows were read one
step ahead).

Mechanics (:class:`ReadAhead`): the trainer names the next batch (``next_ids``: a function
that gathers its ids); the engine's forward, after it has taken this batch's rows, runs the
next batch's step of the exchange (:meth:`launch`: on a side stream while a CUDA graph is
captured, inline otherwise) and keeps its result (:class:`Primed`); the next forward given the
primed batch's ids takes those rows instead of exchanging. Anything that runs a step of the
table in between (an evaluation, a flush, a checkpoint, an eager step on other ids) makes the
primed rows unusable (:meth:`take` checks that the pending gradient is still the one left by
the step that primed them), and they are dropped: the exchange that made them had applied the
last batch's gradient and only read, so dropping them loses nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from hetgmp.embedding.batch import Batch, Prep
from hetgmp.embedding.padded.local_now import refresh_stored
from hetgmp.embedding.padded.streams import priority_stream

# Reads one step ahead in the multi-rank whole-step graph (hetgmp.train.graphed_multi) where
# --bound >= 1 and the batch per rank is at most AUTO_MAX_BATCH. Measured on 2 H100s with the
# user's command (bench/results/gpu/read_ahead_ab/README.md, 2026-11-26): batch 8192 1.29x ->
# 1.44x of one GPU, val AUC 0.7749 vs 0.7755 strict; batch 65536 26.9M -> 25.6M samples/s (the
# dense part fills the GPU there: the side stream finds no idle SMs, and the stored rows'
# update and re-read cost a pass each), so large batches keep the strict order.
# Off by default since 2026-11-26 (it lets a read exceed --bound: module docstring).
ENABLED = False
AUTO_MAX_BATCH = 16384
# The next batch's plan made while this batch trains (exact: module docstring).
PLAN_AHEAD = True
# With it, the next batch's exchange started right after this batch's backward, under the
# dense all-reduce and optimizer (exact: module docstring).
EXCHANGE_EARLY = True
# The rows stored here take a batch's gradient at the end of its step and the next step
# reads them from the table (.local_now): only rows not stored here and peers' pushes are a
# step late (False: every row is, the first version's lag).
STORED_AT_ONCE = True
# The next batch's exchange on a side stream while a graph is captured (False: in order on the
# captured stream, no overlap: a diagnosis of what the overlap changes).
SIDE_STREAM = True
# Reading ahead (ENABLED): the next batch's whole exchange on a stream of the exchange's
# priority (the highest) instead of the default one (the lowest, below the step's own stream:
# the forward and backward then starve it). A diagnosis switch (off).
AHEAD_HIGH = False


@dataclasses.dataclass(eq=False)
class Primed:
    """The next batch's plan and, when reading ahead, its exchange done: its rows
    (``values``, block order) and its record (both None when only planned ahead);
    ``after``: the batch record whose gradient must be pending when it is taken."""

    prep: Prep
    values: torch.Tensor | None
    batch: Batch | None
    after: Batch
    # made after this batch's gradient was applied (an early exchange): exact, taken only
    # when no step ran since (ReadAhead.primed_at)
    exact: bool = False


class ReadAhead:
    """One table's read-ahead state (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # set by the trainer for one step: gathers the next batch's ids (None: no read ahead)
        self.next_ids: Callable[[], torch.Tensor] | None = None
        self.primed: Primed | None = None
        # read the next batch's rows too (True), or only plan it (False: exact)
        self.values = False
        # the next batch's exchange right after this batch's backward (exact)
        self.early = False
        self.primed_at = -1  # the stepper's step count when an exact primed was made
        self.dropped = 0  # rows exchanged early and then dropped (a step ran in between)
        # (made now: not while a graph captures)
        self._side = (
            None
            if device.type != "cuda"
            else (priority_stream(device, "exchange") if AHEAD_HIGH else torch.cuda.Stream(device))
        )
        self._forked = False

    def take(self, ids: torch.Tensor, grads: Any, count: int) -> Primed | None:
        """The primed exchange if ``ids`` is its batch's ids tensor and the pending gradient
        ``grads`` is the one it was primed after (an exact one: no step ran since it was
        made, ``count`` being the stepper's step count); else None (and it is dropped)."""
        p, self.primed = self.primed, None
        if p is None or p.prep.ids is not ids:
            self.dropped += p is not None and p.exact
            return None
        if p.exact:
            ok = grads is None and count == self.primed_at
            self.dropped += not ok
            return p if ok else None
        if grads is None or grads[0] is not p.after:
            return None
        if STORED_AT_ONCE and p.batch is not None and p.batch.static is not None:
            assert p.values is not None
            refresh_stored(p.batch.static, p.prep, p.values)
        return p

    def launch(self, fn: Callable[[], Primed]) -> None:
        """Run ``fn`` (the next batch's exchange) and keep its result: on a side stream that
        starts after what the current stream has queued (this batch's rows are taken) while a
        CUDA graph is captured, so the two overlap in every replay; inline otherwise (an
        eager fork would make the next capture depend on uncaptured work, which CUDA
        refuses)."""
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if not (capturing and SIDE_STREAM):
            self.primed = fn()
            return
        main = torch.cuda.current_stream(self.device)
        assert self._side is not None
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):
            self.primed = fn()
        self._forked = True

    def join(self) -> None:
        """The current stream waits for the side stream (before a captured step ends)."""
        if self._forked and self._side is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._side)
            self._forked = False

    def exchange_early(
        self,
        step: Callable[[Prep], tuple[torch.Tensor, Batch]],
        count: Callable[[], int],
        side: Callable[[Callable[[], None]], None],
    ) -> None:
        """The primed plan's exchange now (``step``), after this batch's backward: through
        ``side``, which runs it on the stream of the gradient's sum while a graph is
        captured (inline otherwise); ``count``: the stepper's step count after it."""
        p = self.primed
        if not self.early or p is None or p.batch is not None:
            return

        def run() -> None:
            if SIDE_STREAM and self._side is not None and self._forked:
                torch.cuda.current_stream(self.device).wait_stream(self._side)  # (the plan)
            values, batch = step(p.prep)
            self.primed = Primed(p.prep, values, batch, p.after, exact=True)
            self.primed_at = count()

        side(run)
