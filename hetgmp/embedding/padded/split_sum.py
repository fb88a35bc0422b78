"""The rows' gradient summed in two parts (``exchange.SPLIT_SUM``, off until measured on GPUs).

Why: in the whole-step graph the next batch's exchange starts after this batch's gradient is
summed per row (~100 us of a 0.86 ms step at batch 8192 on 2 H100s), but the exchange's first
half (the mirrors' local step, the pushes' gradients, the payload and its all-to-all) needs
only the rows not owned here, ~a fifth of the occurrences; the own rows' sum is needed first
by the owners' update, after the all-to-all. So the side stream sums the other rows' part and
starts the exchange while the main stream sums the own rows' part; the exchange waits for it
just before the owners' update (``StaticExchange.before_answer``), and the own rows' gradient
phase (:func:`.kernels.presync_values` with ``part=2``) runs there.

The split is the batch's own-row count, read on the device from its sizes table. Without a
captured graph (CPU tests, eager steps) both parts run in order on one stream: the same sums.
"""

from __future__ import annotations

from typing import Any

import torch

from hetgmp.embedding import sizes
from hetgmp.embedding.padded import kernels as fused_segments


def sum_split(
    st: Any, batch: Any, grad_occ: torch.Tensor, side: torch.cuda.Stream | None
) -> torch.Tensor:
    """``batch``'s gradient summed per row into its ring slot's buffer of ``st`` (a fused
    StaticExchange), the rows not owned here on ``side`` (None: everything on the current
    stream), the own rows on the current stream; ``st.split_sum`` tells the next pre-sync of
    this batch to stage its own rows before the owners' update."""
    slot = batch.ring
    g = st.grad_of(slot)
    split = st.tables_of(slot)[0][0, sizes.NOWN : sizes.NOWN + 1]
    if side is None:
        g.zero_()
        fused_segments.sum_part(st, batch.inv, grad_occ, split, 1, slot)
        fused_segments.sum_part(st, batch.inv, grad_occ, split, 2, slot)
        st.split_sum = (slot, None)
        return g
    main = torch.cuda.current_stream(g.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        g.zero_()
    main.wait_stream(side)  # (the own part adds into the zeroed buffer)
    with torch.cuda.stream(side):
        fused_segments.sum_part(st, batch.inv, grad_occ, split, 1, slot)
    fused_segments.sum_part(st, batch.inv, grad_occ, split, 2, slot)
    st.split_sum = (slot, main)
    return g


def own_rows_before_answer(st: Any, prev: Any, own_stream: torch.cuda.Stream | None) -> None:
    """The own rows' gradient phase of ``prev`` (its own rows' sum done, on ``own_stream``)."""
    if own_stream is not None:
        torch.cuda.current_stream(own_stream.device).wait_stream(own_stream)
    fused_segments.presync_values(st, prev, part=2)
