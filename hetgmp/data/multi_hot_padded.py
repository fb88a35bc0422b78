"""A multi-hot data set as the trainer reads it (issue 34, first training slice): every split's
id matrix widened by each multi-hot field's bags, padded with :data:`PAD_ID` (-1) to the
longest bag of that field in the data set.

The trainer's batch paths (loader, prefetch thread, evaluation) gather rows of one ``[N, F]``
matrix; laid out as ``[N, F + W]`` they carry the bags unchanged, and the model's pooled lookup
(:mod:`hetgmp.models.pooling`) takes the ``-1`` slots out. The price is memory: ``N x W`` ids
held in RAM, ``W`` the sum of the fields' longest bags, so a field with a long tail costs far
more than its mean length; the ragged batch path is a later slice of issue 34.
"""

from __future__ import annotations

import numpy as np

from hetgmp.data.dataset_reader import Dataset, SplitArrays

PAD_ID = -1


def bag_widths(ds: Dataset) -> list[int]:
    """Each multi-hot field's longest bag over the train and test splits (at least 1)."""
    widths = [1] * len(ds.meta.multi_hot)
    for split in ("train", "test"):
        if not ds.has_split(split):
            continue
        for k, mh in enumerate(ds.split(split).multi_hot):
            lengths = mh.lengths()
            if lengths.size:
                widths[k] = max(widths[k], int(lengths.max()))
    return widths


def padded_ids(split: SplitArrays, widths: list[int], dtype: type = np.int64) -> np.ndarray:
    """``[N, F + sum(widths)]`` of ``dtype``: the split's single-hot ids, then each field's bag
    in order, padded with :data:`PAD_ID`. (int32 halves the matrix where the table's ids fit:
    5.4M samples with two 20-id fields, longest bags 39: 4.49 GB at int64, 2.25 GB at int32.)"""
    n = len(split)
    single = np.asarray(split.sparse)
    out = np.full((n, single.shape[1] + sum(widths)), PAD_ID, dtype=dtype)
    out[:, : single.shape[1]] = single
    col = single.shape[1]
    for mh, width in zip(split.multi_hot, widths, strict=True):
        offsets = np.asarray(mh.offsets, dtype=np.int64)
        lengths = np.diff(offsets)
        if lengths.size and int(lengths.max()) > width:
            raise ValueError(f"a bag of {int(lengths.max())} ids is wider than {width}")
        owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
        pos = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][owner]
        out[owner, col + pos] = np.asarray(mh.values)
        col += width
    return out


class PaddedBags(Dataset):
    """``ds`` with every split's ``sparse`` the :func:`padded_ids` matrix (``meta`` is
    ``ds``'s: ``meta.num_fields`` still counts the single-hot fields)."""

    def __init__(self, ds: Dataset, widths: list[int]) -> None:
        super().__init__(ds.root, ds.meta, ds.derived)
        self.base = ds
        self.widths = list(widths)
        fits = ds.meta.num_embeddings <= np.iinfo(np.int32).max
        self.dtype: type = np.int32 if fits else np.int64

    def split(self, split: str) -> SplitArrays:
        if split not in self._splits:
            base = self.base.split(split)
            self._splits[split] = SplitArrays(
                padded_ids(base, self.widths, self.dtype),
                base.dense,
                base.labels,
                base.multi_hot,
            )
        return self._splits[split]
