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

COMPAT_KEYS = ("model", "embed_dim", "table_dim", "num_rows", "dataset_fingerprint")


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
        # Another worker count: the shards differ, so continue at the same share of the epoch,
        # and count the steps done in this world's steps (a global step of w ranks covers w
        # batches: kept in the old world's units, --epochs would train the wrong amount)
        spe_old = int(ck.manifest.get("steps_per_epoch", tr.steps_per_epoch))
        batch = min(round(pos.batch * tr.steps_per_epoch / max(1, spe_old)), tr.steps_per_epoch)
        step = pos.epoch * tr.steps_per_epoch + batch
        tr.position = Position(step, pos.epoch, batch, tr.env.world_size)
        tr.log.info(
            f"resuming a {pos.world_size}-rank checkpoint on {tr.env.world_size} ranks: "
            f"epoch {pos.epoch}, batch {tr.position.batch} of {tr.steps_per_epoch}"
        )
    tr.log.info(f"resumed from {ck.path} at step {tr.position.step}")
