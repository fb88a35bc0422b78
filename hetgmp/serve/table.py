"""The serving table: a checkpoint's rows by global id, access counts, and ``--min-count``.

A checkpoint holds every row once, in the shard of the rank that owned it (mirrors are not
saved), keyed by global id, so the union of its shards is the whole table whatever the rank
count. Shards are read one at a time, memory-mapped, and scattered into one ``[num_rows, D]``
tensor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetgmp.serve.artifact import ArtifactError
from hetgmp.train.checkpoint import MANIFEST, LoadedCheckpoint

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_COUNT_ROWS = 1 << 20  # samples per chunk when counting ids of the training split

RARE_RULE = (
    "a row dropped by --min-count maps to its field's rare-id row when the vocabulary names "
    "one and that row is kept, else to the zero row (the last row of 'rows')"
)


def gather_table(ck: LoadedCheckpoint, num_rows: int, table_dim: int) -> torch.Tensor:
    """float32 ``[num_rows, table_dim]`` from every shard; every id 0..num_rows-1 exactly once."""
    table = torch.empty(num_rows, table_dim, dtype=torch.float32)
    seen = torch.zeros(num_rows, dtype=torch.int32)
    for where, sd in ck.embedding_shards():
        ids = sd["ids"].to(torch.int64)
        weight = sd["weight"]
        if weight.dim() != 2 or weight.shape != (ids.numel(), table_dim):
            raise ArtifactError(
                f"{where}: weight of shape {tuple(weight.shape)}, expected "
                f"[{ids.numel()}, {table_dim}] (ids, table_dim)"
            )
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_rows):
            raise ArtifactError(f"{where}: ids outside 0..{num_rows - 1}")
        table[ids] = weight.to(torch.float32)
        seen.index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
    missing = torch.nonzero(seen == 0).reshape(-1)
    if missing.numel():
        raise ArtifactError(
            f"{ck.path}: the shards hold no row for {missing.numel()} of {num_rows} ids "
            f"(first: {missing[:5].tolist()}); the checkpoint is incomplete"
        )
    twice = torch.nonzero(seen > 1).reshape(-1)
    if twice.numel():
        raise ArtifactError(
            f"{ck.path}: {twice.numel()} ids are stored by more than one shard "
            f"(first: {twice[:5].tolist()}); not a consistent checkpoint"
        )
    return table


def checkpoint_counts(ck: LoadedCheckpoint, num_rows: int) -> np.ndarray | None:
    """Per-row access counts saved in the shards (key ``counts``), or None when they have none."""
    counts = np.zeros(num_rows, np.int64)
    for _, sd in ck.embedding_shards():
        if "counts" not in sd:
            return None
        counts[sd["ids"].to(torch.int64).numpy()] = sd["counts"].to(torch.int64).numpy()
    return counts


def dataset_counts(dataset: Any, num_rows: int) -> np.ndarray | None:
    """How often each id occurs in the training split (one epoch's accesses: every value of a
    multi-hot field's bags counts), or None."""
    if not dataset.has_split("train"):
        return None
    split = dataset.split("train")
    counts = np.zeros(num_rows, np.int64)
    columns = [split.sparse, *(mh.values for mh in split.multi_hot)]
    for ids in columns:
        for start in range(0, ids.shape[0], _COUNT_ROWS):
            chunk = np.asarray(ids[start : start + _COUNT_ROWS]).reshape(-1)
            counts += np.bincount(chunk, minlength=num_rows)[:num_rows]
    return counts


def access_counts(ck: LoadedCheckpoint, dataset: Any, num_rows: int) -> tuple[Any, str | None]:
    """(counts or None, where they came from): the checkpoint's, else the training split's."""
    counts = checkpoint_counts(ck, num_rows)
    if counts is not None:
        return counts, "checkpoint"
    if dataset is not None:
        counts = dataset_counts(dataset, num_rows)
        if counts is not None:
            return counts, f"training split of {dataset.root}"
    return None, None


def apply_min_count(
    table: torch.Tensor,
    counts: np.ndarray,
    min_count: int,
    fields: list[dict[str, Any]],
    rare_ids: list[int | None],
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(kept rows + one zero row, index global id -> row, rows dropped); see :data:`RARE_RULE`.

    ``fields``: ``{offset, cardinality}`` per field; ``rare_ids``: each field's local rare id
    (None where it has none)."""
    num_rows = table.shape[0]
    kept = torch.from_numpy(counts >= min_count)
    n_kept = int(kept.sum())
    index = torch.full((num_rows,), n_kept, dtype=torch.int64)  # the zero row
    index[kept] = torch.arange(n_kept, dtype=torch.int64)
    for f, rare in zip(fields, rare_ids, strict=True):
        if rare is None:
            continue
        lo, hi = int(f["offset"]), int(f["offset"]) + int(f["cardinality"])
        rare_g = lo + int(rare)
        if kept[rare_g]:
            dropped = ~kept[lo:hi]
            index[lo:hi][dropped] = index[rare_g]
    rows = torch.cat([table[kept], table.new_zeros(1, table.shape[1])])
    return rows, index, num_rows - n_kept


def refuse_min_count(where: Path) -> ArtifactError:
    """The error of ``--min-count`` when no access counts are known."""
    return ArtifactError(
        f"--min-count: {where / MANIFEST} records no access counts per row, and the training "
        "data set is not available to count them (pass --dataset DIR); export without "
        "--min-count to keep every row"
    )
