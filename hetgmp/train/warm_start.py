"""``--init-from CHECKPOINT`` (and ``Trainer.init_from``): a new run starts from a checkpoint's
rows, dense weights and optimizer states (issue 32: daily retraining).

Unlike ``--resume`` it continues nothing else: the run starts at step 0 of its own data, with
its own options (learning rates included: the dense optimizer keeps its state, not the
checkpoint's hyperparameters), and the data may be another day's, encoded with the
checkpoint's vocabulary (``--vocab-from``; its fingerprint differs, which ``--resume``
refuses). Rows are keyed by global id, so any rank count and any plan load it: each rank reads
the rows it stores (owned and mirrored).

**Row ids.** When the data set's table has the checkpoint's rows and layout, ids are the same.
When its vocabulary was grown from the checkpoint's (``preprocess --vocab-from DIR
--grow-vocab``; ``vocab/manifest.json`` ``grown_from`` names the old layout), old values kept
their local ids while fields moved: old row ``g`` of field ``f`` is row ``g - old_offset[f] +
new_offset[f]`` here, and the new values' rows keep the table's initialisation (and a fresh
optimizer state), placed by the plan like any row (a plan is made per data set; without one,
hash placement). Anything else (another layout, model, dimension or optimizer state) is refused
with what differs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hetgmp.train.checkpoint import MANIFEST, CheckpointError, LoadedCheckpoint

if TYPE_CHECKING:
    from hetgmp.data.format import Dataset
    from hetgmp.train.trainer_view import TrainerView

_SAME = ("model", "embed_dim", "table_dim", "field_dims")


def layout_of(ds: Dataset) -> list[list[Any]]:
    """``[[name, offset, cardinality], ...]`` of a data set's fields (recorded in checkpoints)."""
    return [[f.name, int(f.offset), int(f.cardinality)] for f in ds.meta.fields]


class RowMap:
    """This data set's global row ids <-> the checkpoint's (affine per field; -1: a new row)."""

    def __init__(self, old: list[list[Any]], new: list[list[Any]]) -> None:
        self.old_off = np.array([f[1] for f in old], np.int64)
        self.old_card = np.array([f[2] for f in old], np.int64)
        self.new_off = np.array([f[1] for f in new], np.int64)
        self.new_rows = int(sum(f[2] for f in new))

    def to_old(self, ids: torch.Tensor) -> torch.Tensor:
        """The checkpoint's id of each of this table's ``ids`` (-1 where the row is new)."""
        g = ids.cpu().numpy().astype(np.int64)
        f = np.searchsorted(self.new_off, g, side="right") - 1
        local = g - self.new_off[f]
        return torch.from_numpy(np.where(local < self.old_card[f], self.old_off[f] + local, -1))

    def to_new(self, ids: torch.Tensor) -> torch.Tensor:
        """This table's id of each of the checkpoint's ``ids``."""
        g = ids.cpu().numpy().astype(np.int64)
        f = np.searchsorted(self.old_off, g, side="right") - 1
        return torch.from_numpy(g - self.old_off[f] + self.new_off[f])


def row_map(ck: LoadedCheckpoint, ds: Dataset) -> RowMap:
    """How the checkpoint's rows map onto ``ds``'s table, or a :class:`CheckpointError` saying
    why they cannot (see the module docstring)."""
    where = ck.path / MANIFEST
    have_rows = int(ck.manifest.get("num_rows", -1))
    have = ck.manifest.get("fields")  # (checkpoints before issue 32 lack it)
    new = layout_of(ds)
    # (imported here: the vocabulary modules pull in pyarrow, ~0.15 s of every training
    # process's start-up, and only a warm start reads a vocabulary)
    from hetgmp.data.vocab_files import has_vocabulary, read_manifest
    from hetgmp.data.vocab_grow import growth_of

    grown = growth_of(read_manifest(ds.root)) if has_vocabulary(ds.root) else None
    if have_rows == ds.meta.num_embeddings and (have is None or have == new):
        return RowMap(new, new)
    if grown is not None and int(grown["num_embeddings"]) == have_rows:
        old = [[g["name"], int(g["offset"]), int(g["cardinality"])] for g in grown["fields"]]
        names_fit = [o[0] for o in old] == [n[0] for n in new]
        if (
            (have is None or have == old)
            and names_fit
            and all(o[2] <= n[2] for o, n in zip(old, new, strict=True))
        ):
            return RowMap(old, new)
    made = f" (fields {_fields(have)})" if have else ""
    raise CheckpointError(
        f"{where}: its table has {have_rows} rows{made}, data set {ds.root} has "
        f"{ds.meta.num_embeddings} (fields {_fields(new)})"
        + (f", grown from {grown['num_embeddings']} rows" if grown else "")
        + ": encode the new data with the checkpoint's vocabulary (hetgmp preprocess ... "
        "--vocab-from <the checkpoint's data set> [--grow-vocab])"
    )


def _fields(layout: list[list[Any]]) -> str:
    return ", ".join(f"{f[0]}:{f[2]}" for f in layout[:6]) + (" ..." if len(layout) > 6 else "")


def check_shapes(ck: LoadedCheckpoint, info: dict[str, Any]) -> None:
    """Refuse a checkpoint of another model or dimension, naming both values."""
    for key in _SAME:
        have, want = ck.manifest.get(key), info.get(key)
        if key in info and have != want:
            raise CheckpointError(
                f"{ck.path / MANIFEST}: made with {key}={have!r}, this run has {key}={want!r}; "
                "--init-from needs the same model and embedding dimension"
            )


def warm_start(tr: TrainerView, ck: LoadedCheckpoint) -> None:
    """Load ``ck``'s rows (mapped onto this data set's ids), dense weights and optimizer states
    into the trainer; the position stays at step 0 (see the module docstring)."""
    check_shapes(ck, tr.info)
    rows = row_map(ck, tr.dataset)
    loaded, total = _load_rows(tr.model.embedding, ck, rows)
    _load_dense(tr, ck)
    tr.log.info(
        f"init from {ck.path}: dense weights and optimizer state, {loaded} of the {total} rows "
        f"this rank stores ({total - loaded} new, initialised); step 0 of {tr.dataset.root}"
    )


def _load_rows(emb: Any, ck: LoadedCheckpoint, rows: RowMap) -> tuple[int, int]:
    """The stored rows' values and optimizer states from ``ck``; (rows found, rows stored)."""
    stored = getattr(emb, "stored_ids", None)
    if stored is not None:  # a distributed table: read only the rows this rank stores
        old = rows.to_old(stored)
        got = ck.embedding_rows(old[old >= 0])
    else:
        got = ck.embedding_union()
    _check_row_optimizer(emb, ck)
    saved = got["opt_state"]
    n_stored = int(stored.numel()) if stored is not None else rows.new_rows
    if got["ids"].numel() == 0:  # (every row this rank stores is new)
        return 0, n_stored
    sd = {"ids": rows.to_new(got["ids"]), "weight": got["weight"], "opt_state": saved}
    emb.load_state_dict(sd, strict=False)
    return int(sd["ids"].numel()), n_stored


def _check_row_optimizer(emb: Any, ck: LoadedCheckpoint) -> None:
    """Refuse rows whose optimizer state does not fit this table's optimizer (a table without
    state, SGD, takes any checkpoint's rows and leaves the state behind)."""
    opt = getattr(emb, "opt", None)
    if opt is None or not opt.state_width:
        return
    have = ck.manifest.get("config", {}).get("optimizer")
    if have is not None and have != opt.name:
        raise CheckpointError(
            f"{ck.path / MANIFEST}: its rows were trained with --optimizer {have}, whose state "
            f"does not fit this run's --optimizer {opt.name}; use --optimizer {have}"
        )


def _load_dense(tr: TrainerView, ck: LoadedCheckpoint) -> None:
    """Dense weights and the dense optimizer's state; this run's hyperparameters stay."""
    dense = ck.dense()
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in tr.dense_opt.param_groups]
    try:
        tr.model.load_dense_state_dict(dense["model"])
        tr.dense_opt.load_state_dict(dense["optimizer"])
    except (KeyError, ValueError) as err:
        raise CheckpointError(
            f"{ck.path / 'dense.pt'}: does not fit this model ({err}); --init-from needs the "
            "same model, fields, dense features and --dense-optimizer"
        ) from err
    for group, h in zip(tr.dense_opt.param_groups, hyper, strict=True):
        group.update(h)  # (the new run's learning rates, not the checkpoint's)
