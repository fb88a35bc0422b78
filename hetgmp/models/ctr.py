"""The CTR models: WDL, DCN, DeepFM (HET-GMP's shapes) and DLRM (NVIDIA's shapes).

Every model is a plain ``nn.Module`` that is handed its embedding module: anything whose
``forward(ids: LongTensor[B, F]) -> Tensor[B, F, table_dim]`` holds the rows (a distributed
table, a single-process reference table, or ``nn.Embedding``). Models know nothing about ranks
or communication. ``forward(sparse, dense)`` returns logits ``[B, 1]``; apply a sigmoid for
probabilities.

``table_dim(embed_dim)`` says how wide the embedding rows must be: DeepFM keeps its first-order
weight as one extra column of the same table so that one lookup (one exchange) serves both terms.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hetgmp.models.field_dims import FieldDims, FieldProjection
from hetgmp.models.layers import (
    MLP,
    CrossNetwork,
    dot_interaction,
    first_layer,
    flat_inputs,
    run_layers,
)
from hetgmp.models.pooling import BagLayout

# HET-GMP's deep part for WDL / DCN / DeepFM.
HETGMP_MLP = (256, 256, 256)
DCN_CROSS_LAYERS = 3
DLRM_BOTTOM = (512, 256)  # followed by a layer of width embed_dim
DLRM_TOP = (1024, 1024, 512, 256, 1)


class CTRModel(nn.Module):
    """Common plumbing: the injected embedding and the input shapes."""

    def __init__(
        self, embedding: nn.Module, num_fields: int, num_dense: int, embed_dim: int,
        field_dims: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        if num_fields < 1 or embed_dim < 1 or num_dense < 0:
            raise ValueError(
                f"invalid model shape: num_fields={num_fields}, num_dense={num_dense}, "
                f"embed_dim={embed_dim}"
            )
        self.embedding = embedding
        self.num_fields = num_fields
        self.num_dense = num_dense
        self.embed_dim = embed_dim
        self.fields = FieldDims(num_fields, embed_dim, field_dims)
        # multi-hot fields' bags and their pooling (issue 34), set by the trainer's setup;
        # None: every field is single-hot and ``sparse`` goes to the table as it is
        self.bags: BagLayout | None = None

    @staticmethod
    def table_dim(embed_dim: int) -> int:
        """Width of the embedding rows this model needs for ``embed_dim``."""
        return embed_dim

    def use_kernels(self, kernels: str, device: torch.device) -> str | None:
        """Pick the dense part's fused kernels for ``--kernels`` on ``device``; returns the
        backend chosen, or ``None`` for a model without any (all but DCN)."""
        return None

    def first_linears(self) -> tuple[nn.Linear, ...]:
        """The linear layers applied first, side by side, to the whole input
        ``[flat rows, dense]`` when the rest of the model needs only their outputs (then
        :meth:`from_first` computes the logits from them); ``()`` for a model that needs the
        rows themselves further on. Serving uses it (:mod:`hetgmp.serve.first_layer`)."""
        return ()

    def from_first(self, h: torch.Tensor) -> torch.Tensor:
        """The logits ``[B, 1]`` from the outputs of :meth:`first_linears`, side by side."""
        raise NotImplementedError(f"{type(self).__name__} has no separable first layer")

    def dense_parameters(self) -> list[nn.Parameter]:
        """Parameters trained data-parallel (everything except the embedding table)."""
        emb = {id(p) for p in self.embedding.parameters()}
        return [p for p in self.parameters() if id(p) not in emb]

    def dense_state_dict(self) -> dict[str, torch.Tensor]:
        """State of the dense part only (the embedding checkpoints its own rows).

        Built from parameters and buffers directly: ``state_dict()`` would recurse into the
        embedding, whose ``state_dict`` may be a collective (a distributed table flushes first).
        """
        out: dict[str, torch.Tensor] = {}
        for name, t in itertools.chain(self.named_parameters(), self.named_buffers()):
            if not name.startswith("embedding."):
                out[name] = t.detach()
        return out

    def load_dense_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        own = self.dense_state_dict()
        missing = sorted(set(own) - set(sd))
        unexpected = sorted(set(sd) - set(own))
        if missing or unexpected:
            raise ValueError(
                f"dense state does not fit {type(self).__name__}: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        for k, v in own.items():
            if v.shape != sd[k].shape:
                raise ValueError(
                    f"dense state {k}: shape {tuple(sd[k].shape)}, model has {tuple(v.shape)}"
                )
        with torch.no_grad():
            for k, v in own.items():
                v.copy_(sd[k])

    def forward(self, sparse: torch.Tensor, dense: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, 1]`` of ids ``sparse [B, F]`` and dense features ``dense [B, num_dense]``."""
        return self.head(self.lookup(sparse), dense)

    def head(self, emb: torch.Tensor, dense: torch.Tensor | None) -> torch.Tensor:
        """Logits ``[B, 1]`` from the looked-up rows ``emb [B, F, table_dim]``: everything
        after the lookup (the dense part). Its inputs and outputs have fixed shapes for a
        fixed batch size, whatever ids a batch holds, so a training step can replay it as a
        CUDA graph (:mod:`hetgmp.train.graphed_head`)."""
        raise NotImplementedError

    def rows_of(self, sparse: torch.Tensor) -> torch.Tensor:
        """The table's rows of ``sparse``: ``[B, F, table_dim]``; with :attr:`bags` the
        multi-hot fields' bags pooled into one row each (:mod:`hetgmp.models.pooling`)."""
        if self.bags is None:
            return self.embedding(sparse)
        return self.bags.lookup(self.embedding, sparse)

    def table_ids(self, sparse: torch.Tensor) -> torch.Tensor:
        """The ids the table is handed for the batch ``sparse``: ``sparse`` itself, or with
        :attr:`bags` the batch's ids with padding taken out
        (:meth:`~hetgmp.models.pooling.BagLayout.table_ids`), the tensor the next lookup of
        ``sparse`` hands the table (what a table told of the batch ahead recognises)."""
        return sparse if self.bags is None else self.bags.table_ids(sparse)

    def lookup(self, sparse: torch.Tensor) -> torch.Tensor:
        emb = self.rows_of(sparse)
        if emb.dim() != 3 or emb.shape[1] != self.num_fields:
            raise ValueError(
                f"embedding returned shape {tuple(emb.shape)}, expected [B, {self.num_fields}, D]"
            )
        return emb


class WDL(CTRModel):
    """Wide & Deep: a linear (wide) logit plus an MLP 256-256-256 (deep) logit over
    the concatenated embeddings and dense features."""

    def __init__(
        self, embedding: nn.Module, num_fields: int, num_dense: int, embed_dim: int,
        field_dims: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(embedding, num_fields, num_dense, embed_dim, field_dims)
        in_dim = self.fields.flat_dim + num_dense
        self.wide = nn.Linear(in_dim, 1)
        self.deep = MLP(in_dim, HETGMP_MLP)
        self.deep_out = nn.Linear(self.deep.out_dim, 1)
        self._deep_rest = tuple(self.deep)[1:]  # (registered under deep; a plain tuple here)

    def head(self, emb: torch.Tensor, dense: torch.Tensor | None) -> torch.Tensor:
        # The wide logit is one more output of the deep part's first layer (the same inputs):
        # one pass over the [B, F*D] input instead of a matrix-vector product of its own, whose
        # backward wrote a second input-sized gradient to add to the deep one (same arithmetic,
        # same parameters: ``wide`` and ``deep[0]`` stay separate in the state dict).
        emb = self.fields.flat(emb)  # (per-field dimensions: each field's first d_f columns)
        return self.from_first(first_layer(emb, dense, self.first_linears()))

    def first_linears(self) -> tuple[nn.Linear, ...]:
        return (self.deep.first, self.wide)

    def from_first(self, h: torch.Tensor) -> torch.Tensor:
        n = self.deep.first.out_features
        x = run_layers(self._deep_rest, h[:, :n])
        return h[:, n : n + 1] + self.deep_out(x)


class DCN(CTRModel):
    """Deep & Cross: 3 cross layers and an MLP 256-256-256 side by side, joined by a linear layer."""

    def __init__(
        self, embedding: nn.Module, num_fields: int, num_dense: int, embed_dim: int,
        field_dims: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(embedding, num_fields, num_dense, embed_dim, field_dims)
        in_dim = self.fields.flat_dim + num_dense
        self.cross = CrossNetwork(in_dim, DCN_CROSS_LAYERS)
        self.deep = MLP(in_dim, HETGMP_MLP)
        self.out = nn.Linear(in_dim + self.deep.out_dim, 1)
        self._deep_rest = tuple(self.deep)[1:]  # (registered under deep; a plain tuple here)

    def use_kernels(self, kernels: str, device: torch.device) -> str | None:
        """The cross network on the fused Triton kernels (:mod:`hetgmp.models.cross`) or on
        torch: :func:`hetgmp.models.cross.resolve_cross` (``--kernels``) on ``device``."""
        from hetgmp.models.cross import resolve_cross

        self.cross.backend = resolve_cross(kernels, device)
        return self.cross.backend

    def head(self, emb: torch.Tensor, dense: torch.Tensor | None) -> torch.Tensor:
        # the deep part's first layer and the output layer without concatenations
        # (hetgmp.models.layers.first_layer says why)
        emb = self.fields.flat(emb)  # (per-field dimensions: each field's first d_f columns)
        deep = first_layer(emb, dense, (self.deep.first,))[:, : self.deep.first.out_features]
        deep = run_layers(self._deep_rest, deep)
        return self._cross_logit(emb, dense) + F.linear(
            deep, self.out.weight[:, self.cross_dim :], self.out.bias
        )

    @property
    def cross_dim(self) -> int:
        """The cross network's width (the fields' dimensions summed, plus ``num_dense``)."""
        return self.cross.weights[0].numel()

    def _cross_logit(self, emb: torch.Tensor, dense: torch.Tensor | None) -> torch.Tensor:
        """The output layer's cross term ``x_L . out.weight[:, :k]`` (float32 ``[B, 1]``)."""
        w, k = self.out.weight, self.cross_dim
        if self.cross.backend != "torch":  # fused: one read of the rows, no concatenation
            b = emb.shape[0]
            flat = emb.reshape(b, emb.shape[1] * emb.shape[2])
            with torch.autocast(emb.device.type, enabled=False):
                return self.cross.logit(flat, dense, w[0, :k])
        x0 = flat_inputs(emb, dense)  # (the cross layers' elementwise input)
        # The cross layers stay in float32 under autocast: they are elementwise passes over the
        # [B, F*D] input (no matrix product to speed up), and bf16 added casts around each
        # (2.8M vs 2.4M samples/s at batch 65536 on an H200 with them under autocast).
        with torch.autocast(x0.device.type, enabled=False):
            x0 = x0.to(torch.promote_types(x0.dtype, torch.float32))  # (bf16 -> fp32)
            return F.linear(self.cross(x0), w[:, :k])


class DeepFM(CTRModel):
    """DeepFM: first-order term (one weight per id, plus a linear map of dense features),
    the FM second-order term over field embeddings, and an MLP 256-256-256.

    The table holds ``embed_dim + 1`` columns: the last is the id's first-order weight. With
    a dimension per field the FM term pairs fields over their common columns (a field's
    unused ones count as zeros): fields i and j interact through their first min(d_i, d_j).
    """

    def __init__(
        self, embedding: nn.Module, num_fields: int, num_dense: int, embed_dim: int,
        field_dims: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(embedding, num_fields, num_dense, embed_dim, field_dims)
        self.dense_linear = nn.Linear(num_dense, 1) if num_dense else None
        self.deep = MLP(self.fields.flat_dim + num_dense, HETGMP_MLP)
        self.deep_out = nn.Linear(self.deep.out_dim, 1)

    @staticmethod
    def table_dim(embed_dim: int) -> int:
        return embed_dim + 1

    def lookup(self, sparse: torch.Tensor) -> torch.Tensor:
        emb = self.rows_of(sparse)
        if emb.dim() != 3 or emb.shape[1:] != (self.num_fields, self.embed_dim + 1):
            raise ValueError(
                f"embedding returned shape {tuple(emb.shape)}, DeepFM expects "
                f"[B, {self.num_fields}, {self.embed_dim + 1}] (embed_dim + first-order column)"
            )
        return emb

    def head(self, emb: torch.Tensor, dense: torch.Tensor | None) -> torch.Tensor:
        vec, first = emb[..., : self.embed_dim], emb[..., self.embed_dim]
        vec = self.fields.masked(vec)  # (per-field dimensions: the unused columns as zeros)
        logit = first.sum(dim=1, keepdim=True)
        if self.dense_linear is not None and dense is not None:
            logit = logit + self.dense_linear(dense.to(vec.dtype))
        # FM: 0.5 * ((sum v)^2 - sum v^2), summed over the embedding dimension.
        fm = 0.5 * (vec.sum(dim=1).pow(2) - vec.pow(2).sum(dim=1)).sum(dim=1, keepdim=True)
        h = first_layer(self.fields.flat(vec), dense, (self.deep.first,))[
            :, : self.deep.first.out_features
        ]
        deep = self.deep_out(run_layers(tuple(self.deep)[1:], h))
        return logit + fm + deep


class DLRM(CTRModel):
    """DLRM: bottom MLP 512-256-D over dense features, dot interaction of the bottom output with
    every field embedding, top MLP 1024-1024-512-256-1 over [bottom output, interactions]."""

    def __init__(
        self, embedding: nn.Module, num_fields: int, num_dense: int, embed_dim: int,
        field_dims: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(embedding, num_fields, num_dense, embed_dim, field_dims)
        # Without dense features there is no bottom MLP; interactions are among fields only.
        self.bottom = MLP(num_dense, (*DLRM_BOTTOM, embed_dim)) if num_dense else None
        # a dimension per field: each narrower field projected to the common one (embed_dim)
        self.project = FieldProjection(self.fields)
        k = num_fields + (1 if self.bottom is not None else 0)
        top_in = k * (k - 1) // 2 + (embed_dim if self.bottom is not None else 0)
        self.top = MLP(top_in, DLRM_TOP, last_activation=False)

    def head(self, emb: torch.Tensor, dense: torch.Tensor | None) -> torch.Tensor:
        emb = self.project(emb)
        if self.bottom is None:
            return self.top(dot_interaction(emb))
        if dense is None:
            raise ValueError(f"DLRM was built for {self.num_dense} dense features but got none")
        bottom = self.bottom(dense.to(emb.dtype))
        inter = dot_interaction(torch.cat([bottom.unsqueeze(1), emb], dim=1))
        return self.top(torch.cat([bottom, inter], dim=1))


MODELS: dict[str, type[CTRModel]] = {"wdl": WDL, "dcn": DCN, "dfm": DeepFM, "dlrm": DLRM}


def model_class(name: str) -> type[CTRModel]:
    """The model class for a ``--model`` name (wdl, dcn, dfm, dlrm)."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(
            f"--model {name!r}: unknown model; choose one of {sorted(MODELS)}"
        ) from None


def build_model(
    name: str, embedding: nn.Module, *, num_fields: int, num_dense: int, embed_dim: int,
    field_dims: Sequence[int] | None = None,
) -> CTRModel:  # fmt: skip
    """Instantiate model ``name`` around ``embedding`` (whose rows are ``table_dim`` wide);
    ``field_dims``: each field's dimension (at most ``embed_dim``; None: all ``embed_dim``)."""
    return model_class(name)(embedding, num_fields, num_dense, embed_dim, field_dims)
