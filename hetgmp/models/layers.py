"""Building blocks shared by the CTR models: MLPs, DCN cross layers, DLRM's dot interaction."""

from __future__ import annotations

from collections.abc import Sequence

import torch
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
