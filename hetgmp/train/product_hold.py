"""The first layer's deferred weight product held until the exchange's chain has started, in a
captured step of several ranks (:data:`PRODUCT_AFTER_STAGE`).

Why: after the rows' gradient sum two paths run to the step's end, the exchange's chain
(its pre-sync gradient kernel, pack, a barrier, the owner's update, answers, a barrier,
finish) and the dense path (the deferred first-layer product, the gradients' sum over ranks,
Adam). With ``exchange.SUM_FIRST`` the product (~43 us at batch 8192 on an H100) starts right
after the sum, beside the chain's first kernel, which then takes ~49 us instead of ~20; the
rest of the chain is latency-bound and leaves most SMs idle. Held until that first kernel is
queued, the product runs under the chain's latency-bound part instead, and the chain starts
~29 us earlier (2 H100s, session 17's kernel timeline; ``docs/scaling_plan.md``, session 18).
The arithmetic is unchanged: the same product on the same operands, added by the same code,
before the dense gradients are summed; only the order of two independent kernels moves.

How: the trainer sets a gate on the first layer (:func:`~hetgmp.models.deferred_wgrad.
set_product_gate`) for the step's backward; the product's closure lands in :class:`ProductHold`
instead of running; once the exchange's work after backward is queued, :meth:`ProductHold.
release` makes the current stream wait for the event the table recorded after the pre-sync
kernel (``DistributedEmbedding.take_staged``; none outside a capture: then nothing to wait
for) and runs the held closures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hetgmp.models.deferred_wgrad import set_product_gate

# Off: measured on 2 H100s at batch 8192 (variants afterstage / afterstagecadam, medians of 2
# rounds, bench/results/gpu/tail_order_s19/): 1.665x and 1.695x against 1.722x one GPU; the
# product under the chain's kernels slows them more than it frees the pre-sync kernel.
PRODUCT_AFTER_STAGE = False


class ProductHold:
    """The deferred products of one backward, held (see the module docstring)."""

    def __init__(self, linear: nn.Linear, table: Any) -> None:
        self.linear, self.table = linear, table
        self.runs: list[Callable[[], None]] = []
        set_product_gate(linear, self._hold)
        table.mark_staged(True)

    def _hold(self, run: Callable[[], None]) -> None:
        # (the gate is closed once held: a later backward, e.g. an evaluation's, runs its own)
        self.runs.append(run)
        set_product_gate(self.linear, None)

    def release(self) -> None:
        """Run the held products, after the event the table recorded (if any), without
        recording autograd history (as at the end of backward, where they ran before)."""
        event = self.table.take_staged()
        self.close()
        runs, self.runs = self.runs, []
        if event is not None and runs:  # (recorded inside this capture, on the exchange's stream)
            torch.cuda.current_stream().wait_event(event)
        with torch.no_grad():
            for run in runs:
                run()

    def close_gate(self) -> None:
        """Products run at the end of backward again (once this backward's are held)."""
        set_product_gate(self.linear, None)

    def close(self) -> None:
        """The gate closed and the table records no more events."""
        self.close_gate()
        self.table.mark_staged(False)


def hold_products(
    model: Any, table: Any, after_backward: Callable[[], None] | None
) -> ProductHold | None:
    """A hold for this step's backward where it applies: on, a step that queues the exchange's
    work after backward (``after_backward``), a model with a first layer whose weight product
    is deferred; else None (the product runs at the end of backward)."""
    if not PRODUCT_AFTER_STAGE or after_backward is None or not hasattr(table, "mark_staged"):
        return None
    linears = model.first_linears() if hasattr(model, "first_linears") else ()
    return ProductHold(linears[0], table) if linears else None
