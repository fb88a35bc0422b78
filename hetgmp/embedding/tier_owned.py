"""Several ranks with ``--rows-on host`` (issue 33): each rank's owned rows, with their
optimizer state and versions, on a host tier (:class:`~.tiered.TieredRows`) whose device cache
is the store's own region; mirrors stay on the device as they are (a mirror already is a
cache of another rank's row, sized by the plan's store rate, and its sync state lives by
mirror slot: tiering it would buy little and touch the write rule).

How the step sees it: the store's own slots are cache slots. ``store.slot_of`` maps an owned
id to its cache slot while it is resident (-1 while only in host memory), kept in step with
the tier's moves (:meth:`OwnedTier._moved`), so the collective step -- its batch plan, the
exact exchange, the protocol's rules -- runs unchanged on cache slots, with the same
arithmetic as all on the device (equal bit for bit at any bound). What makes that true:
every owned row a step touches is resident and *held* (never evicted) from before its slot is
read until its last use:

* ``cur``: this rank's batch's owned rows, made resident before the batch is planned
  (:meth:`OwnedTier.before_plan`) and held until the next step has applied their update (a
  collective step applies the previous batch's gradient);
* ``prev``: the previous batch's, let go once this step applied them
  (:meth:`OwnedTier.applied`), marked updated (written back when evicted) if a gradient came;
* ``peer``: the owned rows the peers read and push this step, known once payload 1 arrived
  (:meth:`OwnedTier.serve`), held until the step ends (:meth:`OwnedTier.step_done`), the
  pushed ones marked updated;
* ``epoch``: every owned row an epoch's steps touch, on every rank (:meth:`OwnedTier.hold_epoch`,
  from :func:`.tier_epoch.epoch_requests`), held until the next epoch's hold: for a step with
  no residency decision of its own (the whole-step CUDA graph of the padded exchange,
  :func:`.tier_epoch.hold_rows`, window by window: :mod:`.tier_windows`). Empty unless used.

The exact exchange's steps (evaluation's too) decide per step; the padded exchange's only in
the whole-step flow, from an epoch's hold (the async one serves rows from a thread:
:mod:`.tier_setup` refuses it). Residency is decided at the step
(a peer's reads are known only within it): the one-rank tier's ahead-of-step staging
(:mod:`.tier_ahead`) is not used here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from hetgmp.embedding.errors import EmbeddingInputError
from hetgmp.embedding.store import RowStore, positions_of
from hetgmp.embedding.tier_host import positions
from hetgmp.embedding.tier_move import Move
from hetgmp.embedding.tiered import TieredRows

_NONE = torch.empty(0, dtype=torch.int64)  # no slots held (never written to)


class OwnedTier:
    """A rank's owned rows on ``tier`` (rows ``0..n-1`` = the owned ids ``own_ids``,
    ascending), the cache being ``store``'s own region (see the module docstring)."""

    def __init__(self, store: RowStore, tier: TieredRows, own_ids: np.ndarray) -> None:
        self.store, self.tier = store, tier
        self.own_ids = torch.from_numpy(own_ids.astype(np.int64))  # tier row -> global id
        self.index = torch.full((store.num_rows,), -1, dtype=torch.int64)  # global -> row
        self.index[self.own_ids] = torch.arange(own_ids.size, dtype=torch.int64)
        # held cache slots (host int64; see the module docstring), kept as slot lists so a
        # step's bookkeeping costs O(its rows), never O(the cache)
        self.prev, self.cur, self.peer = _NONE, _NONE, _NONE
        # (the rows an epoch's steps touch, held for the epoch: :meth:`hold_epoch`; released
        # by a flush, after which the whole-step flow holds again: :meth:`release_epoch`)
        self.epoch = _NONE
        self.released = False
        tier.on_move = self._moved

    def _moved(self, move: Move) -> None:
        """The store's id -> slot map (and stored ids) after a residency decision."""
        s = self.store
        if move.evicted_rows.numel():
            s.slot_of[self.own_ids.index_select(0, move.evicted_rows).to(s.device)] = -1
        if move.load_rows.numel():
            ids = self.own_ids.index_select(0, move.load_rows).to(s.device)
            slots = move.load_slots.to(s.device)
            s.slot_of[ids] = slots.to(torch.int32)
            s.stored_ids[slots] = ids

    # ------------------------------------------------------------------ an epoch's hold
    def hold_epoch(self, ids: torch.Tensor) -> torch.Tensor:
        """(At an epoch start; docs/host_tier_plan.md, several ranks inside the whole-step
        graph) the owned rows of ``ids`` (global ids, any order, may repeat: every rank's
        epoch reads and pushes of rows owned here, :func:`.tier_epoch.epoch_requests`) made
        resident and held until the next call, so no step of the epoch needs a residency
        decision. The last epoch's held rows are marked updated first (its steps may have
        written any of them: an eviction writes them back); ``ids`` hold the batch before
        the window too, whose gradient its first step applies (:mod:`.tier_windows`).
        Returns the held cache slots."""
        self.settle_epoch()
        rows = self.index.index_select(0, ids.reshape(-1).to("cpu", torch.int64))
        if bool((rows < 0).any()):  # (every rank's owner map is the same: a breach)
            raise EmbeddingInputError(
                f"rank {self.store.rank}: an epoch's requests hold ids this rank does not own"
            )
        self.epoch = self.tier.make_resident(rows, [self.prev, self.cur, self.peer], batch=False)
        self.released = False
        return self.epoch

    def release_epoch(self) -> None:
        """(After a flush: every rank, nothing pending) the epoch's hold let go, so that an
        evaluation or a checkpoint between steps has the cache (the hold may fill it); the
        whole-step flow holds its window again before its next step (``released``)."""
        self.settle_epoch()
        self.epoch, self.released = _NONE, True

    def settle_epoch(self) -> None:
        """The epoch's held rows marked updated (before a flush, or a new epoch's hold)."""
        if self.epoch.numel():
            self.tier.mark_updated(self.epoch)

    # ------------------------------------------------------------------ a step's holds
    def before_plan(self, ids: torch.Tensor | None) -> None:
        """This rank's batch (``ids``; None: none, a flush or bad input) is planned next: its
        owned rows made resident beside the held ones, and held as ``cur``. Ids out of range
        are left for the step to report collectively."""
        self.cur = self.peer = _NONE  # (a step stopped at its sizes exchange left its batch's)
        if ids is None:
            return
        flat = ids.reshape(-1).to("cpu", torch.int64)
        # (index_select and numpy positions, not [] and masks: several times cheaper on the
        # host for a batch's ~213k ids)
        flat = flat.index_select(0, positions((flat >= 0) & (flat < self.store.num_rows)))
        rows = self.index.index_select(0, flat)
        self.cur = self.tier.make_resident(
            rows.index_select(0, positions(rows >= 0)), [self.prev, self.epoch]
        )

    def serve(self, pushed: torch.Tensor, read: list[torch.Tensor]) -> None:
        """(After payload 1) the owned rows peers push (``pushed``) and read (``read``: global
        ids) made resident beside this rank's held rows, held until :meth:`step_done`; the
        pushed ones marked updated (the step applies them before anything is evicted)."""
        push_rows = self.index[pushed.to("cpu", torch.int64)]
        rows = torch.cat([push_rows, *(self.index[t.to("cpu", torch.int64)] for t in read)])
        if not rows.numel():
            return
        if bool((rows < 0).any()):  # (the owner map is every rank's: a protocol breach)
            raise EmbeddingInputError(
                f"rank {self.store.rank}: a peer sent ids of rows this rank does not own"
            )
        self.peer = self.tier.make_resident(rows, [self.prev, self.cur, self.epoch], batch=False)
        if push_rows.numel():
            self.tier.mark_updated(self.tier.slots_of(push_rows))

    def applied(self, updated: bool) -> None:
        """This step applied the previous batch's gradient to its owned rows (``updated``:
        there was one): they are marked updated and let go."""
        if updated:
            self.tier.mark_updated(self.prev)
        self.prev = _NONE

    def step_done(self) -> None:
        """The step ended: the peers' rows let go; this batch's held until the next step."""
        self.peer, self.prev, self.cur = _NONE, self.cur, _NONE

    def drop(self) -> None:
        """Nothing held (pending gradients dropped: rows loaded)."""
        self.prev = self.cur = self.peer = _NONE

    # ------------------------------------------------------------------ save / load by id
    def owned_rows(self) -> dict[str, torch.Tensor]:
        """``{"ids", "weight", "opt_state"}`` of every owned row from host memory (after
        writing the cache's updated rows back), as :meth:`RowStore.owned_rows`."""
        self.settle_epoch()
        self.tier.flush()
        t = self.tier
        return {"ids": self.own_ids.clone(), "weight": t.host_weight.clone(),
                "opt_state": t.host_state.clone()}  # fmt: skip

    def load_rows(self, sd: Mapping[str, Any], *, partial: bool) -> None:
        """Every owned row's host copy from ``sd`` (rows by global id; the store loaded and
        checked its own region and mirrors first), versions restarted at 0, the cache
        re-read from host memory."""
        ids = torch.as_tensor(sd["ids"]).to(torch.int64).reshape(-1)
        src, dst = positions_of(ids, self.own_ids, partial=partial, rank=self.store.rank)
        t = self.tier
        t.flush()
        t.host_weight[dst] = torch.as_tensor(sd["weight"])[src].to(torch.float32)
        if t.state_width:
            t.host_state[dst] = torch.as_tensor(sd["opt_state"])[src].to(torch.float32)
        if t.host_version is not None:
            t.host_version.zero_()
        self.drop()
        t.reload()
