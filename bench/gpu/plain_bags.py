"""The plain-PyTorch contender on multi-hot data (issue 34's figure): WDL over one table whose
single-hot fields are looked up by ``F.embedding`` and whose multi-hot fields are pooled by
``nn.EmbeddingBag``'s kernel (sum or mean per field), sparse gradients, SGD; the head, the
optimizers, the resident data and the timed loop are ``plain_trainer.py``'s.

The bags come padded to each field's longest bag, as ``hetgmp train`` reads them
(:mod:`hetgmp.data.multi_hot_padded`): ``[N, F + W]`` ids, the -1 slots mapped to an extra zero
row named ``padding_idx`` (left out of the pooling, a mean's count included, and never updated:
``nn.EmbeddingBag``'s own padding, as a PyTorch user pads a batch of lists).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.gpu.plain_models import HEADS, PlainCTR
from bench.gpu.plain_trainer import PlainTrainer, Split
from hetgmp.choices import parse_pooling
from hetgmp.data.format import open_dataset
from hetgmp.data.multi_hot_padded import PAD_ID, PaddedBags, bag_widths


class PlainBagCTR(PlainCTR):
    """One ``nn.EmbeddingBag(num_rows + 1, dim, sparse=True, padding_idx=num_rows)`` for every
    field + a dense head over ``[B, (F + K) * dim + num_dense]``."""

    def __init__(self, model: str, *, num_rows: int, num_single: int, widths: tuple[int, ...],
                 pooling: tuple[str, ...], num_dense: int, embed_dim: int,
                 init_scale: float = 0.01) -> None:  # fmt: skip
        nn.Module.__init__(self)
        if model not in HEADS:
            raise ValueError(f"--model {model!r}: choose one of {sorted(HEADS)}")
        self.num_single, self.widths, self.pooling = num_single, widths, pooling
        self.num_fields, self.embed_dim = num_single + len(widths), embed_dim
        self.emb = nn.EmbeddingBag(num_rows + 1, embed_dim, sparse=True, padding_idx=num_rows)
        with torch.no_grad():  # (hetgmp's --init_scale; the padding row stays zero)
            self.emb.weight[:num_rows].uniform_(-init_scale, init_scale)
        self.head = HEADS[model](self.num_fields * embed_dim + num_dense)

    def flat(self, sparse: torch.Tensor, dense: torch.Tensor | None) -> torch.Tensor:
        """``[B, (F + K) * dim (+ dense)]``: the single-hot rows, then each field's pooled bag."""
        w, f = self.emb.weight, self.num_single
        parts = [F.embedding(sparse[:, :f], w, sparse=True).reshape(sparse.shape[0], -1)]
        col = f
        for width, mode in zip(self.widths, self.pooling, strict=True):
            bag = sparse[:, col : col + width]
            parts.append(F.embedding_bag(bag, w, mode=mode, sparse=True,
                                         padding_idx=self.emb.padding_idx))  # fmt: skip
            col += width
        if dense is not None:
            parts.append(dense.to(parts[0].dtype))
        return torch.cat(parts, dim=1)


def load_bag_splits(root: Path, device: torch.device) -> tuple[Split, Split, Any, list[int]]:
    """The train and test splits with their bags padded (-1 -> the padding row), on
    ``device``; the data set's meta and the bags' widths."""
    base = open_dataset(root)
    if not base.meta.multi_hot:
        raise SystemExit(f"{root}: no multi-hot fields (generate with --multi-hot)")
    widths = bag_widths(base)
    ds = PaddedBags(base, widths)
    pad = base.meta.num_embeddings
    out = []
    for name in ("train", "test"):
        s = ds.split(name)
        ids = torch.from_numpy(np.array(s.sparse)).to(device).long()
        ids = torch.where(ids == PAD_ID, pad, ids)
        dense = None if s.dense is None else torch.from_numpy(np.array(s.dense)).to(device)
        labels = torch.from_numpy(np.array(s.labels, dtype=np.float32)).to(device)
        out.append(Split(ids, dense, labels.reshape(-1, 1)))
    return out[0], out[1], base.meta, widths


class BagTrainer(PlainTrainer):
    """``PlainTrainer`` on :class:`PlainBagCTR` (``args.widths``, ``args.pooling``)."""

    def make_model(self, meta: Any) -> PlainCTR:
        a = self.args
        return PlainBagCTR(
            a.model, num_rows=meta.num_embeddings, num_single=meta.num_fields,
            widths=tuple(a.widths), pooling=parse_pooling(a.pooling, len(a.widths)),
            num_dense=meta.num_dense, embed_dim=a.embed_dim, init_scale=a.init_scale,
        )  # fmt: skip


def trainer_args(dataset: Path, batch: int, embed_dim: int, pooling: str, lr: float,
                 widths: list[int], seed: int = 0) -> argparse.Namespace:  # fmt: skip
    """What :class:`BagTrainer` reads of its arguments (``plain_ctr.py``'s names)."""
    return argparse.Namespace(
        dataset=dataset, model="wdl", batch=batch, embed_dim=embed_dim, lr=lr,
        dense_lr=1e-3, dense_opt="adam", init_scale=0.01, seed=seed, pooling=pooling,
        widths=widths,
    )  # fmt: skip
