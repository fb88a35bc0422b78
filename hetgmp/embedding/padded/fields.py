"""What the padded exchange's segments work on: its fixed sizes (:class:`Capacity`) and the
fields of its buffers that the segments read and write (:class:`SegmentBuffers`).

Why a protocol and not the class: the segments (:mod:`.reference`, :mod:`.kernels`) are
called by the buffers' owner (:class:`~.buffers.StaticExchange`), so naming that class here
would make the segments and their caller import each other. :class:`~.buffers.StaticExchange`
has every field below (it is the only implementation).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:  # pragma: no cover
    from hetgmp.embedding.context import StepContext
    from hetgmp.embedding.optim import SparseOptimizer
    from hetgmp.embedding.store import RowStore


@dataclasses.dataclass(frozen=True)
class Capacity:
    """Fixed sizes of one set of static buffers."""

    q: int  # query rows per peer (each way)
    p: int  # pushed rows per peer (each way)
    u: int  # unique rows of this rank's batch
    n: int  # occurrences per batch (batch x fields)
    o: int = 0  # the last batch's own rows, staged for the owner's merged update (Adagrad)


# Preparation ring slots (graphs.PrepRing) and the per-slot buffers of the exchange: the batch
# trained, the last one (its gradient not pushed yet) and the next one, prepared while this one
# trains (reads one step ahead, :mod:`.ahead`) are three.
SLOTS = 3


class SegmentBuffers(Protocol):
    """The buffers of one :class:`Capacity` as the segments see them (names as in
    :class:`~.buffers.StaticExchange`, which documents each)."""

    # settings (constants inside the captured graphs)
    ctx: StepContext
    store: RowStore
    opt: SparseOptimizer
    cap: Capacity
    frozen: bool  # capacities fixed in advance (due pushes may wait for room)
    bound: int
    lr: float
    rank: int
    kernels: str
    w: int
    d: int
    sw: int
    # the batch (inputs)
    u_pad: torch.Tensor
    u_ids: torch.Tensor
    slot_pad: torch.Tensor
    slot: torch.Tensor
    blocks: torch.Tensor
    sz_mine: torch.Tensor
    sz_theirs: torch.Tensor
    sz_prev: torch.Tensor  # the last batch's table (its ring slot's)
    pos_map: torch.Tensor
    # the last batch's gradient: pushes per owner, own rows
    pr_ids: torch.Tensor
    pr_cnt: torch.Tensor
    pr_grad: torch.Tensor
    pr_n: torch.Tensor
    p_ids: torch.Tensor
    p_cnt: torch.Tensor
    p_grad: torch.Tensor
    own_slot: torch.Tensor
    own_cnt: torch.Tensor
    own_grad: torch.Tensor
    own_entries: torch.Tensor
    # payloads
    send1: torch.Tensor
    recv1: torch.Tensor
    send2: torch.Tensor
    recv2: torch.Tensor
    q_slots: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    # index ranges, and where padding entries write (trash rows, zero adds spread over rows)
    ar_own: torch.Tensor
    ar_p_push: torch.Tensor
    ar_q: torch.Tensor
    ar_u: torch.Tensor
    ar_wp: torch.Tensor
    ar_wq: torch.Tensor
    skip_m: int
    skip_s: int
    skip_u: int
    spread_own: torch.Tensor
    spread_u: torch.Tensor
    spread_wp: torch.Tensor
    spread_wq_m: torch.Tensor
    # outputs
    values: torch.Tensor
    from_table: bool  # (.take: the stored rows' slots in src instead of their values)
    src: torch.Tensor
    grad: torch.Tensor  # the last batch's gradient summed per row (its ring slot's)
    rows_step: torch.Tensor
    deferred: torch.Tensor
    cap_deferred: torch.Tensor  # due pushes that waited for room in a fixed push payload
