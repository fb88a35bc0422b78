"""The single-process reference table: the whole table in one place, no communication.

It is the slow, obviously-correct model the distributed table is tested against: same initial
values (:mod:`hetgmp.embedding.init`), same sparse optimizers, same timing (a step's gradients
are applied at the start of the next ``forward`` or at ``flush``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hetgmp.embedding.batch import input_problem, range_error
from hetgmp.embedding.counters import zero_counters
from hetgmp.embedding.errors import EmbeddingInputError
from hetgmp.embedding.init import initial_rows
from hetgmp.embedding.optim import SparseOptimizer


def check_ids(ids: torch.Tensor, num_rows: int) -> str | None:
    """The problem with a batch of ids, or None when it is a valid int64 ``[B, F]`` tensor
    (the same messages as the distributed table's)."""
    problem = input_problem(ids)
    if problem is None and ids.numel() and (ids.min() < 0 or ids.max() >= num_rows):
        problem = range_error(ids, num_rows)
    return problem


class ReferenceEmbedding(nn.Module):
    """Full-table embedding with the :class:`DistributedEmbedding` interface (no communication)."""

    def __init__(
        self,
        num_rows: int,
        dim: int,
        *,
        optimizer: str = "sgd",
        lr: float = 0.01,
        init_scale: float = 0.01,
        seed: int = 0,
        adagrad_eps: float = 1e-10,
        adagrad_init: float = 0.0,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__()
        self.num_rows, self.dim = int(num_rows), int(dim)
        self.device = torch.device(device)
        self.opt = SparseOptimizer(optimizer, lr, adagrad_eps, adagrad_init)
        all_ids = torch.arange(self.num_rows, dtype=torch.int64, device=self.device)
        self.weight = initial_rows(all_ids, self.dim, seed=seed, scale=init_scale)
        self.opt_state = self.opt.new_state(self.num_rows, self.device)
        self.version = torch.zeros(self.num_rows, dtype=torch.int64, device=self.device)
        self._grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._total = zero_counters()
        self._step = zero_counters()

    def _apply_pending(self) -> None:
        if self._grads is None:
            return
        uniq, cnt, grad = self._grads
        self._grads = None
        self.opt.apply(self.weight, self.opt_state, uniq, grad)
        self.version.index_add_(0, uniq, cnt)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        err = check_ids(ids, self.num_rows)
        if err:
            raise EmbeddingInputError(err)
        ids = ids.to(self.device)
        if self.training:
            self._apply_pending()
        b, f = ids.shape
        uniq, inv, cnt = torch.unique(ids.reshape(-1), return_inverse=True, return_counts=True)
        vals = self.weight.index_select(0, uniq)
        self._step = zero_counters()
        self._step.update(rows_owned=uniq.numel(), rows_requested=uniq.numel(), steps=1)
        for k, v in self._step.items():
            self._total[k] += v
        if self.training and torch.is_grad_enabled():
            leaf = vals.requires_grad_()

            def capture(g: torch.Tensor) -> None:
                self._grads = (uniq, cnt, g.detach())

            leaf.register_hook(capture)
            vals = leaf
        # Same gather as DistributedEmbedding (sort-based backward for repeated ids).
        return F.embedding(inv.view(b, f), vals)

    def flush(self) -> None:
        """Apply the pending gradients of the last step."""
        self._apply_pending()

    def counters(self) -> dict[str, int]:
        return dict(self._total)

    def step_counters(self) -> dict[str, int]:
        return dict(self._step)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        self.flush()
        return {
            "ids": torch.arange(self.num_rows, dtype=torch.int64),
            "weight": self.weight.detach().cpu().clone(),
            "opt_state": self.opt_state.detach().cpu().clone(),
        }

    def load_state_dict(
        self, sd: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        ids = sd["ids"].to(torch.int64)
        if strict and (ids.numel() != self.num_rows or torch.unique(ids).numel() != self.num_rows):
            raise ValueError(f"state dict holds {ids.numel()} rows, table has {self.num_rows}")
        self.weight[ids.to(self.device)] = sd["weight"].to(self.device)
        if self.opt_state.numel():
            self.opt_state[ids.to(self.device)] = sd["opt_state"].to(self.device)
        self._grads = None
        return None
