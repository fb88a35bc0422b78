"""The rows one rank stores: values, versions, optimizer state, the mirrors' sync state, the
id -> slot / block map, and loading / saving rows by global id.

Storage (all on the rank's device):

* ``weight [S, D]`` float32, ``version [S]`` int64 and ``opt_state`` of the ``S = n_own +
  n_mir`` stored rows: slots ``[0, n_own)`` are the rows this rank owns, ``[n_own, S)`` its
  mirrors, grouped by owner (so the mirrors due for a push come out of one stable compaction
  already in destination order). For an owned row ``version`` counts the sample-level updates
  applied (one per occurrence of the id in a batch); for a mirror it is the owner version its
  value reflects.
* mirrors also keep ``pending`` (local updates not yet pushed), ``grad_acc`` (their raw summed
  gradient, what is pushed) and ``delta_acc`` (what was applied locally, re-added on refresh).
* with several ranks every state tensor has one extra *trash* row after the real ones
  (``weight_full`` / ``version_full``: slot ``trash_slot = S``; mirror buffers: row ``n_mir``)
  where the padded exchange writes its padding entries; ``weight``, ``version``... are views
  without it.
* id -> slot map: a dense ``slot_of [num_rows]`` int32 (-1 = not stored) plus ``block_of
  [num_rows]`` int32, the row's block key in a batch (own: ``rank``; mirror: ``w + owner``;
  not stored: ``2w + owner``; one gather instead of six elementwise ops per step). 8 bytes per
  global row: 270 MB for Criteo's 33.8M rows, small next to the rows, and a lookup is one
  gather (no search, no hashing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from hetgmp.embedding.init import initial_rows
from hetgmp.embedding.memory import check_fits
from hetgmp.embedding.optim import SparseOptimizer


class RowStore:
    """Rows of one rank (see the module docstring). ``owner``: owner rank of every row;
    ``mirrors``: the row ids this rank mirrors (any order; stored grouped by owner).
    ``resident``: (several ranks, owned rows on a host tier: :mod:`.tier_owned`) the owned
    ids the own slots hold at first -- the own region is then the tier's device cache
    (``n_own`` its rows), the other owned ids map to slot -1 until the tier loads them.
    ``init_on``: the device the initial rows are hashed on (default ``device``; a host tier's
    rows in host memory are hashed on its CUDA device: the same bits, much sooner)."""

    def __init__(
        self, num_rows: int, dim: int, *, rank: int, world: int, device: torch.device,
        owner: np.ndarray, mirrors: np.ndarray, opt: SparseOptimizer, seed: int,
        init_scale: float, resident: np.ndarray | None = None,
        init_on: torch.device | None = None,
    ) -> None:  # fmt: skip
        self.num_rows, self.dim, self.rank, self.world = num_rows, dim, rank, world
        self.device = dev = device
        owned = np.flatnonzero(owner == rank) if resident is None else resident
        mirrors = mirrors[np.argsort(owner[mirrors], kind="stable")]
        self.n_own, self.n_mir = int(owned.size), int(mirrors.size)
        check_fits(
            num_rows,
            dim,
            self.n_own + self.n_mir,
            self.n_mir,
            opt.state_width,
            rank=rank,
            world=world,
            device=device,
        )  # fmt: skip (before anything is allocated: a clear message, not an OOM)
        self._index(owner, owned, mirrors)
        # (one extra trash row with several ranks, see the module docstring)
        s_rows, extra = self.n_own + self.n_mir, int(world > 1)
        self.trash_slot = s_rows
        init_ids = torch.cat([self.stored_ids, torch.zeros(extra, dtype=torch.int64, device=dev)])
        self.weight_full = initial_rows(init_ids, dim, seed=seed, scale=init_scale, compute=init_on)
        self.version_full = torch.zeros(s_rows + extra, dtype=torch.int64, device=dev)
        self.pending_full = torch.zeros(self.n_mir + extra, dtype=torch.int64, device=dev)
        self.grad_acc_full = torch.zeros(self.n_mir + extra, dim, device=dev)
        self.delta_acc_full = torch.zeros(self.n_mir + extra, dim, device=dev)
        self.weight = self.weight_full[:s_rows] if extra else self.weight_full
        self.version = self.version_full[:s_rows]
        self.opt_state_full = opt.new_state(s_rows + extra, dev)
        self.opt_state = self.opt_state_full[:s_rows] if opt.state_width else self.opt_state_full
        self.pending = self.pending_full[: self.n_mir]
        self.grad_acc = self.grad_acc_full[: self.n_mir]
        self.delta_acc = self.delta_acc_full[: self.n_mir]
        self.state_width = opt.state_width
        self._scratch: torch.Tensor | None = None  # see scratch_map

    def _index(self, owner: np.ndarray, owned: np.ndarray, mirrors: np.ndarray) -> None:
        """The id -> slot / block maps, the stored ids and the mirrors' owner groups."""
        w, r, dev = self.world, self.rank, self.device
        slot_of = np.full(self.num_rows, -1, dtype=np.int32)
        slot_of[owned] = np.arange(self.n_own, dtype=np.int32)
        slot_of[mirrors] = self.n_own + np.arange(self.n_mir, dtype=np.int32)
        block_of = owner.astype(np.int32) + 2 * w  # not stored here: 2w + owner
        block_of[owner == r] = r  # (every owned row, also those a host tier holds)
        block_of[mirrors] -= w  # mirror: w + owner
        self.block_of = torch.from_numpy(block_of).to(dev)
        self.slot_of = torch.from_numpy(slot_of).to(dev)
        ids = np.concatenate([owned, mirrors]).astype(np.int64)
        self.stored_ids = torch.from_numpy(ids).to(dev)
        mir_end = np.cumsum(np.bincount(owner[mirrors], minlength=w)).astype(np.int64)
        # owner of every mirror slot (mirrors are grouped by owner) and 0..n_mir-1
        self.mir_owner = torch.from_numpy(owner[mirrors].astype(np.int64)).to(dev)
        self.mir_arange = torch.arange(self.n_mir, dtype=torch.int64, device=dev)
        self.mir_end = torch.from_numpy(mir_end).to(dev)
        self.mir_start = torch.from_numpy(np.concatenate([[0], mir_end[:-1]])).to(dev)
        self.zeros_w = torch.zeros(w, dtype=torch.int64, device=dev)

    def due_per_owner(self, due: torch.Tensor) -> torch.Tensor:
        """``[w]`` the number of due mirrors per owner (``due [n_mir]`` bool): mirrors are
        stored grouped by owner, so these are differences of one prefix sum."""
        c = torch.cat([self.zeros_w[:1], torch.cumsum(due, 0)])
        return c.index_select(0, self.mir_end) - c.index_select(0, self.mir_start)

    def scratch_map(self) -> torch.Tensor:
        """``[n_own]`` int64 scratch (a per-slot position map for merging repeated rows; its
        contents are never read before being written), made at first use."""
        if self._scratch is None:
            self._scratch = torch.empty(self.n_own, dtype=torch.int64, device=self.device)
        return self._scratch

    # ---------------------------------------------------------------- save / load by id
    def owned_rows(self) -> dict[str, torch.Tensor]:
        """``{"ids", "weight", "opt_state"}`` of the owned rows, on the CPU (the caller
        flushes first, so owners hold every update)."""
        return {
            "ids": self.stored_ids[: self.n_own].cpu().clone(),
            "weight": self.weight[: self.n_own].cpu().clone(),
            "opt_state": self.opt_state[: self.n_own].cpu().clone(),
        }

    def load_rows(self, sd: Mapping[str, Any], *, partial: bool = False) -> None:
        """Every stored row (owned and mirrored) takes its value from ``sd`` (rows by global
        id: the union of any ranks' :meth:`owned_rows`); versions restart at 0 on all ranks,
        so mirrors start in sync; pending mirror updates are dropped. ``partial``: rows ``sd``
        lacks keep their values (a warm start's new rows keep their initialisation)."""
        ids = torch.as_tensor(sd["ids"]).to(torch.int64).reshape(-1)
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.num_rows):
            raise ValueError(f"state dict holds row ids outside [0, {self.num_rows})")
        src, dst = self._positions_of_stored(ids, partial=partial)
        weight = torch.as_tensor(sd["weight"])
        if weight.shape != (ids.numel(), self.dim):
            raise ValueError(
                f"state dict weight has shape {tuple(weight.shape)}, expected "
                f"({ids.numel()}, {self.dim})"
            )
        dst = dst.to(self.device)
        self.weight[dst] = weight[src].to(self.device, self.weight.dtype)
        if self.state_width:
            state = torch.as_tensor(sd["opt_state"])
            self.opt_state[dst] = state[src].to(self.device, self.opt_state.dtype)
        self.version.zero_()
        self.pending.zero_()
        self.grad_acc.zero_()
        self.delta_acc.zero_()

    def _positions_of_stored(
        self, ids: torch.Tensor, *, partial: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions in ``ids``, the stored rows' slots they go to) for every stored row;
        raises if one is missing, unless ``partial`` (then only the rows ``ids`` holds)."""
        return positions_of(ids, self.stored_ids.cpu(), partial=partial, rank=self.rank)


def positions_of(
    ids: torch.Tensor, want: torch.Tensor, *, partial: bool, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions in ``ids``, positions in ``want``) of the rows of ``want`` (host int64 ids
    a rank stores) that ``ids`` (a state dict's) holds: all of them, else a clear error,
    unless ``partial``."""
    order = torch.argsort(ids)
    sorted_ids = ids[order]
    pos = torch.searchsorted(sorted_ids, want).clamp(max=max(ids.numel() - 1, 0))
    if ids.numel():
        found = sorted_ids[pos] == want
    else:
        found = torch.zeros_like(want, dtype=torch.bool)
    if partial:
        return order[pos[found]], torch.nonzero(found).reshape(-1)
    if not bool(found.all()):
        missing = want[~found]
        raise ValueError(
            f"state dict lacks {missing.numel()} of the {want.numel()} rows rank "
            f"{rank} stores (first missing id {int(missing[0])}); pass the union of "
            "all ranks' dicts"
        )
    return order[pos], torch.arange(want.numel())
