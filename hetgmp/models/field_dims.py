"""A dimension per field (``--embed-dim 16,8,...``, issue 34) over one table width.

The table keeps one row width, the largest field dimension ``D`` (``embed_dim``), so the
partitioned table, the exchange, checkpoints and serving stay as they are; field ``f`` uses
the first ``d_f`` columns of its rows. The models read the rows ``[B, F, D]`` through
:class:`FieldDims`: :meth:`FieldDims.flat` keeps each field's first ``d_f`` columns side by
side (``[B, 1, sum d_f]``, the deep input of WDL, DCN and DeepFM), :meth:`FieldDims.masked`
zeroes the rest (DeepFM's FM term). Both are index/multiply operations whose backward writes
zeros into the unused columns, so those never move: a row's unused columns keep their
initial values, read by no model. DLRM's dot interaction needs one dimension: a
:class:`FieldProjection` maps each narrower field to ``D`` with a learned linear map.

With no per-field dimensions (``field_dims`` None, or all equal) everything here is the
identity and adds no parameters, so such a model is the one-dimension model exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class FieldDims:
    """Each of ``num_fields`` fields' dimension within rows ``embed_dim`` wide."""

    def __init__(self, num_fields: int, embed_dim: int, dims: Sequence[int] | None) -> None:
        if dims is not None:
            dims = tuple(int(d) for d in dims)
            if len(dims) != num_fields or not all(1 <= d <= embed_dim for d in dims):
                raise ValueError(
                    f"field_dims {list(dims)}: expected {num_fields} dimensions (one per "
                    f"field), each in [1, {embed_dim}] (embed_dim, the table's width)"
                )
            if len(set(dims)) == 1 and dims[0] == embed_dim:
                dims = None  # (every field the table's width: the plain model)
        self.num_fields, self.embed_dim = num_fields, embed_dim
        self.dims: tuple[int, ...] | None = dims
        self._cols: torch.Tensor | None = None  # (columns of [F * D] kept, by device)
        self._mask: torch.Tensor | None = None

    @property
    def flat_dim(self) -> int:
        """Width of the fields' concatenation: the sum of their dimensions."""
        return sum(self.dims) if self.dims is not None else self.num_fields * self.embed_dim

    def flat(self, emb: torch.Tensor) -> torch.Tensor:
        """``emb [B, F, D]`` as the concatenation of each field's first ``d_f`` columns,
        ``[B, 1, sum d_f]`` (``emb`` itself without per-field dimensions)."""
        if self.dims is None:
            return emb
        b, f, d = emb.shape
        cols = self._cols
        if cols is None or cols.device != emb.device:
            cols = torch.cat([torch.arange(n) + i * d for i, n in enumerate(self.dims)])
            self._cols = cols = cols.to(emb.device)
        return emb.reshape(b, f * d).index_select(1, cols).unsqueeze(1)

    def masked(self, emb: torch.Tensor) -> torch.Tensor:
        """``emb [B, F, D]`` with each field's columns past ``d_f`` zeroed."""
        if self.dims is None:
            return emb
        mask = self._mask
        if mask is None or mask.device != emb.device:
            d = torch.tensor(self.dims).unsqueeze(1)
            mask = (torch.arange(emb.shape[2]).unsqueeze(0) < d).to(emb.device)
            self._mask = mask
        return emb * mask.to(emb.dtype)


class FieldProjection(nn.Module):
    """Each field narrower than ``embed_dim`` mapped to ``embed_dim`` by a learned linear map
    (no bias) of its ``d_f`` columns; the fields of full width pass as they are (DLRM)."""

    def __init__(self, fields: FieldDims) -> None:
        super().__init__()
        dims = fields.dims or ()
        self.narrow = [f for f, d in enumerate(dims) if d < fields.embed_dim]
        self.dims = dims
        self.maps = nn.ModuleList(
            nn.Linear(dims[f], fields.embed_dim, bias=False) for f in self.narrow
        )

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        """``[B, F, D]`` rows -> ``[B, F, D]`` with the narrow fields projected."""
        if not self.narrow:
            return emb
        out = list(emb.unbind(1))
        for f, lin in zip(self.narrow, self.maps, strict=True):
            out[f] = lin(out[f][:, : self.dims[f]])
        return torch.stack(out, dim=1)
