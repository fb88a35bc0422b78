"""Exact evaluation over the whole test split, across all ranks, on the device.

Every rank scores a contiguous shard of the test split; the scores and labels stay device
tensors and are gathered once per evaluation with one tensor collective (padded to the longest
shard, plus the shard lengths -- nothing is pickled), and the metrics are computed on the complete
arrays with torch ops (:func:`hetgmp.metrics.roc_auc_tensor` and friends, equal to the numpy
functions), so the result is the same for 1, 2 or 8 ranks on the same model state -- unlike
HET-GMP, which averages per-batch AUCs. Ranks whose shard runs out keep calling the embedding
with empty batches until every rank is done, because the distributed table needs every rank at
every exchange.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.distributed as dist

from hetgmp.comm.collectives import all_gather_object, guarded
from hetgmp.comm.env import DistEnv
from hetgmp.data.device_batches import DeviceBatch, EpochPlan, PendingBatch, step_slots
from hetgmp.data.format import SplitArrays
from hetgmp.data.loader import rank_sample_indices
from hetgmp.data.pipeline import PipelineOptions, open_source
from hetgmp.embedding import engine_of
from hetgmp.metrics import accuracy_tensor, log_loss_tensor, roc_auc_tensor
from hetgmp.models import CTRModel


@dataclasses.dataclass
class EvalResult:
    """Whole-split metrics plus how many samples they cover."""

    val_loss: float | None  # (None: undefined, e.g. an empty test split: JSON null, not NaN)
    val_acc: float | None
    val_auc: float | None  # (None also when the split holds one class only)
    samples: int

    def fields(self) -> dict[str, float | None]:
        return {"val_loss": self.val_loss, "val_acc": self.val_acc, "val_auc": self.val_auc}


def score_split(
    model: CTRModel,
    split: SplitArrays,
    env: DistEnv,
    *,
    batch_size: int,
    amp: bool = False,
    prefetch: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (probabilities, labels) for its contiguous shard of ``split``: float32 1-D
    tensors on the rank's device. ``prefetch`` > 0: a background thread reads that many
    batches ahead (:class:`~hetgmp.data.prefetch.ThreadSource`).

    Collective: all ranks must call it. The shard boundaries are those of
    :func:`rank_sample_indices` without a plan, so concatenating the ranks' outputs in rank order
    gives the split in its stored order.
    """
    idx = rank_sample_indices(len(split), env.rank, env.world_size, None)
    plan = EpochPlan(split, idx, batch_size, shuffle=False, seed=0)
    steps = max(all_gather_object(env, plan.local_batches))
    slots = step_slots(plan, step=0, epoch=0, batch=0, steps_per_epoch=steps, total_steps=steps)
    opts = PipelineOptions(data_on_device="off", prefetch_batches=prefetch)
    source, _ = open_source(plan, slots, env.device, opts, num_rows=0)  # rows: resident only
    probs: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for _ in range(steps):
                probs_b, labels_b = _score_batch(model, source.next()[1], env.device, amp)
                probs += probs_b
                labels += labels_b
        table_engine = engine_of(model.embedding)
        engine = table_engine.async_engine() if table_engine is not None else None
        if engine is not None:  # (--sync async: every peer's reads answered before the
            engine.meet("async evaluation")  # process group's collectives that follow)
    finally:
        source.close()
        model.train(was_training)
    empty = torch.zeros(0, dtype=torch.float32, device=env.device)
    cat = lambda xs: torch.cat(xs) if xs else empty  # noqa: E731
    return cat(probs), cat(labels)


def _score_batch(
    model: CTRModel, batch: DeviceBatch | PendingBatch | None, device: torch.device, amp: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """([probabilities], [labels]) of one batch; none for an empty slot, whose lookup still
    runs because the distributed table needs every rank at every exchange."""
    if batch is None:
        fields = model.num_fields
        model.embedding(torch.zeros((0, fields), dtype=torch.long, device=device))
        return [], []
    if isinstance(batch, PendingBatch):  # (a source that defers its gathers)
        batch = batch.gather()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
        logits = model(batch.sparse, batch.dense)
    return [torch.sigmoid(logits.float()).reshape(-1)], [batch.labels.reshape(-1)]


def gather_rows(env: DistEnv, rows: torch.Tensor) -> torch.Tensor:
    """Every rank's ``rows`` ([k, n_rank] on the device) joined along dim 1 in rank order.

    Two tensor collectives: the lengths, then the rows padded to the longest (collective)."""
    if env.group is None or env.world_size <= 1:
        return rows
    n = torch.tensor([rows.shape[1]], dtype=torch.int64, device=rows.device)
    counts = [torch.zeros_like(n) for _ in range(env.world_size)]
    with guarded(env, "gather_rows (lengths)"):
        dist.all_gather(counts, n, group=env.group)
    lengths = torch.cat(counts).tolist()
    longest = max(lengths)
    padded = rows.new_zeros((rows.shape[0], longest))
    padded[:, : rows.shape[1]] = rows
    parts = [torch.empty_like(padded) for _ in range(env.world_size)]
    with guarded(env, "gather_rows"):
        dist.all_gather(parts, padded, group=env.group)
    return torch.cat([p[:, :m] for p, m in zip(parts, lengths, strict=True)], dim=1)


def evaluate(
    model: CTRModel,
    split: SplitArrays,
    env: DistEnv,
    *,
    batch_size: int,
    amp: bool = False,
    prefetch: int = 0,
) -> EvalResult:
    """Exact global logloss / accuracy / AUC of ``model`` on all of ``split`` (collective)."""
    probs, labels = score_split(
        model, split, env, batch_size=batch_size, amp=amp, prefetch=prefetch
    )
    both = gather_rows(env, torch.stack([probs, labels]))
    all_p, all_y = both[0], both[1]
    metrics = torch.stack(
        [log_loss_tensor(all_y, all_p), accuracy_tensor(all_y, all_p), roc_auc_tensor(all_y, all_p)]
    )
    if all_y.numel() == 0:  # (no metric is defined: said as such, not as NaN + warnings)
        return EvalResult(val_loss=None, val_acc=None, val_auc=None, samples=0)
    loss, acc, auc = metrics.tolist()  # the evaluation's one read of device values
    return EvalResult(
        val_loss=loss, val_acc=acc, val_auc=None if math.isnan(auc) else auc,
        samples=int(all_y.numel()),
    )  # fmt: skip
