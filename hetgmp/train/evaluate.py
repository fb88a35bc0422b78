"""Exact evaluation over the whole test split, across all ranks.

Every rank scores a contiguous shard of the test split; the scores and labels of all shards are
gathered and the metrics are computed on the complete arrays (:mod:`hetgmp.metrics`), so the
result is the same for 1, 2 or 8 ranks on the same model state -- unlike HET-GMP, which averages
per-batch AUCs. Ranks whose shard runs out keep calling the embedding with empty batches until
every rank is done, because the distributed table needs every rank at every exchange.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from hetgmp.comm.collectives import all_gather_object
from hetgmp.comm.env import DistEnv
from hetgmp.data.format import SplitArrays
from hetgmp.data.loader import BatchLoader, rank_sample_indices
from hetgmp.metrics import accuracy, log_loss, roc_auc
from hetgmp.models import CTRModel


@dataclasses.dataclass
class EvalResult:
    """Whole-split metrics plus how many samples they cover."""

    val_loss: float
    val_acc: float
    val_auc: float
    samples: int

    def fields(self) -> dict[str, float]:
        return {"val_loss": self.val_loss, "val_acc": self.val_acc, "val_auc": self.val_auc}


def score_split(
    model: CTRModel,
    split: SplitArrays,
    env: DistEnv,
    *,
    batch_size: int,
    amp: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """This rank's (probabilities, labels) for its contiguous shard of ``split``.

    Collective: all ranks must call it. The shard boundaries are those of
    :func:`rank_sample_indices` without a plan, so concatenating the ranks' outputs in rank order
    gives the split in its stored order.
    """
    idx = rank_sample_indices(len(split), env.rank, env.world_size, None)
    loader = BatchLoader(split, batch_size, indices=idx)
    steps = max(all_gather_object(env, len(loader)))
    device = env.device
    num_fields = split.sparse.shape[1]
    probs: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    was_training = model.training
    model.eval()
    it = iter(loader)
    with torch.no_grad():
        for _ in range(steps):
            batch = next(it, None)
            if batch is None:
                # keep answering the other ranks' lookups
                model.embedding(torch.zeros((0, num_fields), dtype=torch.long, device=device))
                continue
            sparse = torch.from_numpy(batch.sparse).to(device)
            dense = None if batch.dense is None else torch.from_numpy(batch.dense).to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                logits = model(sparse, dense)
            probs.append(torch.sigmoid(logits.float()).cpu().numpy().ravel())
            labels.append(batch.labels.ravel())
    model.train(was_training)
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=np.float32)  # noqa: E731
    return cat(probs).astype(np.float32), cat(labels).astype(np.float32)


def evaluate(
    model: CTRModel,
    split: SplitArrays,
    env: DistEnv,
    *,
    batch_size: int,
    amp: bool = False,
) -> EvalResult:
    """Exact global logloss / accuracy / AUC of ``model`` on all of ``split`` (collective)."""
    probs, labels = score_split(model, split, env, batch_size=batch_size, amp=amp)
    parts = all_gather_object(env, (probs, labels))
    all_p = np.concatenate([p for p, _ in parts])
    all_y = np.concatenate([y for _, y in parts])
    return EvalResult(
        val_loss=log_loss(all_y, all_p),
        val_acc=accuracy(all_y, all_p),
        val_auc=roc_auc(all_y, all_p),
        samples=int(all_y.size),
    )
