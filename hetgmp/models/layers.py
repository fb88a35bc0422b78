"""Building blocks shared by the CTR models: MLPs, DCN cross layers, DLRM's dot interaction."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Sequential):
    """Linear layers with ReLU between them; ``last_activation`` adds one after the last layer."""

    def __init__(self, in_dim: int, widths: Sequence[int], *, last_activation: bool = True) -> None:
        layers: list[nn.Module] = []
        dim = in_dim
        for i, w in enumerate(widths):
            layers.append(nn.Linear(dim, w))
            if i + 1 < len(widths) or last_activation:
                layers.append(nn.ReLU())
            dim = w
        super().__init__(*layers)
        self.out_dim = dim


class CrossNetwork(nn.Module):
    """DCN cross layers: ``x_{l+1} = x_0 * (x_l . w_l) + b_l + x_l`` (Wang et al., 2017)."""

    def __init__(self, dim: int, num_layers: int) -> None:
        super().__init__()
        # Small init keeps the cross terms near identity at the start, as in the DCN paper.
        self.weights = nn.ParameterList(
            [nn.Parameter(torch.randn(dim) * 0.01) for _ in range(num_layers)]
        )
        self.biases = nn.ParameterList([nn.Parameter(torch.zeros(dim)) for _ in range(num_layers)])

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for w, b in zip(self.weights, self.biases, strict=True):
            x = x0 * (x @ w).unsqueeze(1) + b + x
        return x


def dot_interaction(vectors: torch.Tensor) -> torch.Tensor:
    """Pairwise dot products of ``vectors`` [B, K, D] below the diagonal -> [B, K*(K-1)/2]."""
    k = vectors.shape[1]
    gram = torch.bmm(vectors, vectors.transpose(1, 2))
    rows, cols = torch.tril_indices(k, k, offset=-1, device=vectors.device)
    return gram[:, rows, cols]


def flat_inputs(emb: torch.Tensor, dense: torch.Tensor | None) -> torch.Tensor:
    """Concatenate flattened embeddings [B, F*D] with dense features [B, num_dense] if any."""
    # explicit width: reshape(B, -1) is ambiguous for an empty batch (B = 0)
    flat = emb.reshape(emb.shape[0], emb.shape[1] * emb.shape[2])
    if dense is None:
        return flat
    return torch.cat([flat, dense.to(flat.dtype)], dim=1)


def first_layer(
    emb: torch.Tensor, dense: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """``F.linear(flat_inputs(emb, dense), weight, bias)`` without materialising the
    concatenation: the embedding part and the dense part each meet their slice of ``weight``.

    Why: at batch 65536 the ``[B, F*D + num_dense]`` input of a Criteo WDL is 876 MB; the
    concatenation (forward) and slicing its gradient back (backward) are two full copies of it,
    and the embedding's gradient then arrives contiguous, so it reshapes to ``[B, F, D]`` for
    free."""
    flat = emb.reshape(emb.shape[0], emb.shape[1] * emb.shape[2])
    k = flat.shape[1]
    out = F.linear(flat, weight[:, :k], bias)
    if dense is not None and dense.shape[1]:
        out = out + F.linear(dense.to(flat.dtype), weight[:, k:])
    return out
