"""The steps the GPU benchmark times: embedding-only and full training, over one rank's data.

Both pick batch ``k`` the same way (:func:`batch_positions`) and hand the next batch to a
contender's prefetch during the step, so every contender pays for the same work per step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hetgmp.comm.env import DistEnv
from hetgmp.train.dense_sync import sum_dense_grads

from . import contenders as C


@dataclasses.dataclass
class RankData:
    """One rank's samples, resident on its device."""

    ids: torch.Tensor  # int64 [n, F]
    dense: torch.Tensor  # float32 [n, 13]
    labels: torch.Tensor  # float32 [n, 1]

    @property
    def n(self) -> int:
        return int(self.ids.shape[0])


def fixed_grad(batch: int, fields: int, dim: int, rank: int, seed: int, device: torch.device):
    """The gradient that stands in for the MLP in embedding-only mode (fixed per rank)."""
    g = torch.Generator(device=device).manual_seed(1_000_003 * seed + rank)
    return torch.randn(batch, fields, dim, generator=g, device=device)


def batch_positions(step: int, batch: int, n: int, device: torch.device) -> torch.Tensor:
    """Positions (into the rank's sample list) of ``step``'s batch: consecutive, wrapping."""
    return (torch.arange(batch, dtype=torch.int64, device=device) + step * batch) % n


def embedding_step_fn(
    cont: C.Contender, ids_all: torch.Tensor, grad: torch.Tensor, batch: int
) -> Callable[[int], None]:
    """The embedding-only step, identical for every contender: ``step(k)`` picks batch ``k``
    of ``ids_all`` (unless it was prefetched), looks it up, hands the next batch to the
    contender's prefetch, runs the backward of the fixed gradient ``grad`` and the contender's
    update. (The positions are computed only to pick ids: a contender that prefetched got
    them a step ahead, so it pays for that once per step, like any other.) Used by
    :meth:`Runner.measure` and the profiling tools."""
    dev, n = ids_all.device, ids_all.shape[0]
    ahead: dict[int, torch.Tensor] = {}  # step -> its ids, already handed to prefetch

    def batch_ids(k: int) -> torch.Tensor:
        return ids_all.index_select(0, batch_positions(k, batch, n, dev))

    def step(k: int) -> None:
        ids = ahead.pop(k, None)
        if ids is None:
            ids = batch_ids(k)
        t = cont.timer
        out = cont(ids)
        if cont.prefetches:  # the next batch's id preprocessing overlaps this step
            ahead[k + 1] = batch_ids(k + 1)
            cont.prefetch(ahead[k + 1])
            t.mark("preprocess")  # launching the next batch's preprocessing
        out.backward(grad)
        t.mark("backward")
        cont.after_backward()

    return step


def train_step_fn(
    cont: C.Contender,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    params: list[torch.Tensor],
    data: RankData,
    env: DistEnv,
    *,
    batch: int,
    global_batch: int,
    autocast: bool,
) -> Callable[[int], None]:
    """The full training step: ``step(k)`` runs the model on batch ``k`` (ids prefetched a step
    ahead where the contender prefetches), the loss summed over the global batch, backward,
    the dense gradients summed over ranks and the dense SGD step; phases marked on the
    contender's timer."""
    dev = env.device
    ahead: dict[int, torch.Tensor] = {}  # step -> its ids, already handed to prefetch

    def batch_ids(k: int) -> torch.Tensor:
        return data.ids.index_select(0, batch_positions(k, batch, data.n, dev))

    def train_step(k: int) -> None:
        ids = ahead.pop(k, None)
        t = cont.timer
        pos = batch_positions(k, batch, data.n, dev)
        if ids is None:
            ids = data.ids.index_select(0, pos)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(ids, data.dense.index_select(0, pos))
        # the MLP forward (after the embedding's own marks) is MLP time, not preprocessing
        t.mark("mlp")
        if cont.prefetches:
            ahead[k + 1] = batch_ids(k + 1)
            cont.prefetch(ahead[k + 1])
            t.mark("preprocess")  # launching the next batch's preprocessing
        loss = (
            F.binary_cross_entropy_with_logits(
                logits.float(), data.labels.index_select(0, pos), reduction="sum"
            )
            / global_batch
        )
        loss.backward()
        t.mark("mlp")
        cont.after_backward()
        sum_dense_grads(env, params)
        t.mark("dense_sync")
        opt.step()
        opt.zero_grad(set_to_none=True)
        t.mark("mlp")

    return train_step
