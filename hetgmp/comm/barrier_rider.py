"""Work of another stream certified by the padded exchange's payload barriers instead of a
meeting of its own (issue 30, ``docs/scaling_plan.md``, session 19).

Why: after backward the 2-GPU step at batch 8192 runs two paths side by side, the exchange's
chain (two device barriers) and the dense path (NCCL's all-reduce, or with
:data:`~hetgmp.comm.peer_allreduce.ADAM_COPY` a copy into the peers' inboxes and a barrier of
its own, then Adam), and each meeting of the ranks costs more than its own kernel: the rank
that arrives first waits for the other (``bench/results/gpu/step_bound_s18/``: 11-22 us in each
device barrier against 5.6 alone, 62-66 us in the all-reduce against 43; one rank's delay of
36 us costs the step 26-29 us, ``rank_delays_s19/``). Riding on the chain's barriers, the dense
gradients need no meeting of their own: the copy is queued on the dense stream once the
chain's first barrier has passed, the chain's second barrier waits for the copy, and Adam waits
for that barrier.

Order (why the inboxes are never overwritten while read): a rank copies into a peer's inbox
only after this step's first payload barrier, which that peer reaches only after its previous
step ended (its Adam, the inbox's reader, included: a step's work follows the last step's on
the training stream, and the exchange's stream follows the backward). A peer's Adam reads the
inbox only after the second barrier, which no rank passes before every rank's copy ended.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class BarrierRider:
    """``copy`` (queued on ``stream``, the dense path's) certified by the exchange's two
    payload barriers (:meth:`after_first`, :meth:`before_second`, :meth:`after_second`, called
    by :class:`~hetgmp.embedding.padded.peer_payloads.PeerPayloads` on the exchange's stream
    around them); :attr:`passed`: an event after the second barrier, once it rode."""

    def __init__(self, stream: torch.cuda.Stream, copy: Callable[[], None]) -> None:
        self.stream = stream
        self._copy = copy
        self._copied: torch.cuda.Event | None = None
        self.passed: torch.cuda.Event | None = None

    def after_first(self) -> None:
        """(The exchange's stream, its first barrier queued) the copy queued after it."""
        if self._copied is not None:  # (one copy per step: a second exchange rides free)
            return
        first = torch.cuda.Event()
        first.record(torch.cuda.current_stream(self.stream.device))
        self.stream.wait_event(first)
        with torch.cuda.stream(self.stream):
            self._copy()
        self._copied = torch.cuda.Event()
        self._copied.record(self.stream)

    def before_second(self) -> None:
        """(The exchange's stream) its second barrier waits for the copy."""
        if self._copied is not None and self.passed is None:
            torch.cuda.current_stream(self.stream.device).wait_event(self._copied)

    def after_second(self) -> None:
        """(The exchange's stream, its second barrier queued) :attr:`passed` recorded."""
        if self._copied is not None and self.passed is None:
            self.passed = torch.cuda.Event()
            self.passed.record(torch.cuda.current_stream(self.stream.device))

    def take(self) -> torch.cuda.Event | None:
        """The event after the barrier that certified this step's copy (None: no exchange
        carried it: the caller meets on its own), and the rider reset for the next step."""
        passed = self.passed
        self._copied = self.passed = None
        return passed
