"""The sizes table of a multi-rank embedding step: one row per peer, exchanged first (the
step's one host sync), so every rank knows what it sends and receives before the payloads.

Row ``j`` is what this rank sends to rank ``j``: mirror queries, not-stored queries, pushes (of
which due mirrors), status (bad input), bound, audit flag, operation, and this rank's own-row
count; then this rank's largest per-peer query and push counts and whether it asks for the
padded exchange. The last five are the same in every row (every rank reads every rank's copy;
only the own copy of the own-row count is read). Defined once here: the exact step
(:mod:`hetgmp.embedding.collective.stepper`) and the padded one's pre-sync segment
(:mod:`hetgmp.embedding.padded.kernels`, :mod:`hetgmp.embedding.padded.reference`) build it with :func:`sizes_table`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

NQM, NQR, NP, NDUE, STATUS, BOUND, SEND_ALL, OP, NOWN, MAXQ, MAXP, PADDED = range(12)
COLS = 12


def sizes_table(
    blocks: torch.Tensor,
    n_push: torch.Tensor,
    ndue: torch.Tensor,
    status: torch.Tensor,
    consts: Sequence[torch.Tensor],
    rank: int,
) -> torch.Tensor:
    """``[w, COLS]`` int64 from the batch's block sizes (``[3w]``: own | mirrors by owner |
    not stored by owner), the per-peer push and due counts (``[w]``), the status scalar and the
    four constant columns (bound, audit flag, operation, padded flag; ``[w]`` each)."""
    w = n_push.numel()
    mirrors, remote = blocks[w : 2 * w], blocks[2 * w : 3 * w]
    c_bound, c_all, c_op, c_pad = consts
    return torch.stack(
        [
            mirrors, remote, n_push, ndue, status.expand(w), c_bound, c_all, c_op,
            blocks[rank].expand(w), (mirrors + remote).max().expand(w), n_push.max().expand(w),
            c_pad,
        ],
        dim=1,
    )  # fmt: skip
