"""Write a trainer's state as a checkpoint, and put a checkpoint's state back into a trainer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetgmp.config import to_dict
from hetgmp.embedding import DistributedEmbedding
from hetgmp.train.checkpoint import (
    LoadedCheckpoint,
    Position,
    check_compatible,
    save_checkpoint,
    set_rng_state,
)
from hetgmp.train.step import table

if TYPE_CHECKING:
    from hetgmp.train.trainer_view import TrainerView

COMPAT_KEYS = ("model", "embed_dim", "table_dim", "num_rows", "dataset_fingerprint", "field_dims")


def compat_info(info: dict[str, Any]) -> dict[str, Any]:
    """The identity a checkpoint must share with the run that resumes it."""
    return {k: info[k] for k in COMPAT_KEYS if k in info}


def save_trainer(tr: TrainerView, root: Path | None = None) -> Path:
    """Flush the table and write a checkpoint at the current position under ``root`` (default:
    the run's checkpoint directory); returns its directory (collective)."""
    root = root if root is not None else tr.cfg.checkpoint_dir
    assert root is not None
    table(tr.model).flush()
    dense = {"model": tr.model.dense_state_dict(), "optimizer": tr.dense_opt.state_dict()}
    path = save_checkpoint(
        root,
        tr.env,
        position=tr.position,
        dense_state=dense,
        embedding_state=tr.model.embedding.state_dict(),
        # (samples_seen: global training samples of the whole run so far, resumes included)
        info={**tr.info, "config": to_dict(tr.cfg), "samples_seen": tr.samples_total},
        keep=tr.cfg.keep_checkpoints,  # (was never passed: --keep-checkpoints had no effect)
    )
    tr.log.info(f"checkpoint {path}", step=tr.position.step)
    return path


def restore_trainer(tr: TrainerView, ck: LoadedCheckpoint) -> None:
    """Load a verified checkpoint: rows, dense state, optimizer states, position, RNG."""
    check_compatible(ck, compat_info(tr.info), dataset=tr.cfg.dataset)
    emb = tr.model.embedding
    if isinstance(emb, DistributedEmbedding):  # (only the rows it stores)
        emb.load_state_dict(ck.embedding_rows(emb.stored_ids))
    else:
        emb.load_state_dict(ck.embedding_union())
    dense = ck.dense()
    try:
        tr.model.load_dense_state_dict(dense["model"])
        tr.dense_opt.load_state_dict(dense["optimizer"])
    except (KeyError, ValueError) as err:
        raise ValueError(f"{ck.path / 'dense.pt'}: does not fit this model ({err})") from err
    pos = ck.position
    tr.samples_before = int(ck.manifest.get("samples_seen", 0))
    if pos.world_size == tr.env.world_size:
        rng = ck.rng(tr.env.rank)
        if rng is not None:
            set_rng_state(rng)
        tr.position = pos
    else:
        tr.position = _reshard_position(tr, ck)
    tr.log.info(f"resumed from {ck.path} at step {tr.position.step}")


def _epoch_samples(counts: list[int], batch: int, batch_size: int) -> int:
    """Samples the ranks of ``counts`` (each rank's share) train in the first ``batch`` batches
    of an epoch (a rank whose share ran out trains nothing more)."""
    return sum(min(batch * batch_size, c) for c in counts)


def _reshard_position(tr: TrainerView, ck: LoadedCheckpoint) -> Position:
    """Where a checkpoint of another worker count goes on: the same epoch, at the last batch
    whose samples (over all new ranks) do not exceed what the old ranks had trained of it.

    Counted in samples, not in the share of steps: rounding the share had skipped up to a
    global step's samples (2 -> 3 ranks: 512). No sample count is skipped now; the shards and
    shuffles differ across worker counts, so the rest of the epoch comes from the new shards
    and up to one global step's samples are trained twice; the log says how many and why."""
    pos, bs, n = ck.position, tr.cfg.batch_size, sum(tr.counts)
    old_counts = ck.manifest.get("rank_samples")  # (absent in older checkpoints: even shards)
    if not (isinstance(old_counts, list) and len(old_counts) == pos.world_size):
        old_counts = [(r + 1) * n // pos.world_size - r * n // pos.world_size
                      for r in range(pos.world_size)]  # fmt: skip
    done = _epoch_samples([int(c) for c in old_counts], pos.batch, bs)
    batch = 0
    while batch < tr.steps_per_epoch and _epoch_samples(tr.counts, batch + 1, bs) <= done:
        batch += 1
    again = done - _epoch_samples(tr.counts, batch, bs)
    tr.log.info(
        f"resuming a {pos.world_size}-rank checkpoint on {tr.env.world_size} ranks: epoch "
        f"{pos.epoch}, batch {batch} of {tr.steps_per_epoch}; the old ranks had trained {done} "
        f"of the epoch's {n} samples; the new ranks train its last {n - done + again}, from "
        f"their own shards (the shards and shuffles differ across worker counts), so {again} "
        "samples of this epoch are trained twice (less than one global step) and none skipped",
        samples_done=done, samples_repeated=again,
    )  # fmt: skip
    return Position(pos.epoch * tr.steps_per_epoch + batch, pos.epoch, batch, tr.env.world_size)
