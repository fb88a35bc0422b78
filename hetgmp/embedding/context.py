"""What every transport works on: the table's rows, protocol settings, optimizer and counters
(:class:`StepContext`), the operation codes a step carries in its sizes table, and the names of
the engines."""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

from hetgmp.comm.barrier_rider import BarrierRider
from hetgmp.comm.env import DistEnv
from hetgmp.embedding.counters import StepCounters
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.profile import PhaseTimer
from hetgmp.embedding.store import RowStore
from hetgmp.embedding.tier_device import DeviceTier
from hetgmp.embedding.tier_owned import OwnedTier
from hetgmp.embedding.tiered import TieredRows

OP_FORWARD, OP_FLUSH = 1, 2
# which step engine a table runs (:class:`hetgmp.embedding.engine.StepEngine`'s ``kind``)
EngineKind = Literal["local", "collective", "async"]
OP_NAMES = {OP_FORWARD: "forward", OP_FLUSH: "flush"}


@dataclasses.dataclass(eq=False)
class StepContext:
    """A table as the transports see it. ``bound``: the staleness bound (owner updates);
    ``send_all``: this rank asks owners for a value for every mirror query (``replies="all"``
    or audit); ``audit``: check and record every read's lag (tests)."""

    env: DistEnv
    store: RowStore
    opt: SparseOptimizer
    counters: StepCounters
    timer: PhaseTimer
    bound: int
    send_all: bool
    audit: bool
    last_audit: dict[str, torch.Tensor] | None = None  # the last audited step's record
    # ``rows_on="host"``: one rank, the store's rows in host memory, a device cache of them;
    # several ranks, ``owned`` too: the owned rows tiered, the store's own slots their cache
    tier: TieredRows | DeviceTier | None = None
    owned: OwnedTier | None = None
    # (train/product_hold.py) while ``mark_staged``, a captured padded step records
    # ``staged``: an event after its pre-sync gradient kernel, which the dense product waits for
    mark_staged: bool = False
    staged: torch.cuda.Event | None = None
    # (comm/barrier_rider.py) another stream's work the padded exchange's payload barriers
    # certify while set (the dense gradients' copy into the peers' inboxes)
    rider: BarrierRider | None = None

    @property
    def kernels(self) -> str:
        """The row kernels' backend (``"torch"`` / ``"triton"``)."""
        return self.opt.kernels
