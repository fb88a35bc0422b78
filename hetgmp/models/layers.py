"""Building blocks shared by the CTR models: MLPs, DCN cross layers, DLRM's dot interaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hetgmp.models import deferred_wgrad


class _AddBias(torch.autograd.Function):
    """``out + bias`` whose bias gradient is a product with a ones vector, not a column sum.

    Why: under bf16 autocast, the bias gradient of a linear layer is a sum of ``[B, C]`` over
    its rows, and torch's reduction of a few hundred bf16 columns took 17 us per layer at
    batch 8192 on an H100 (a 4 MB read), 0.05 ms of a WDL step; the same sum as a
    ``[1, B] x [B, C]`` product runs on the tensor cores in a few us."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return out + bias

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, (grad.new_ones(1, grad.shape[0]) @ grad).view(-1)


def add_bias(out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``out [B, C] + bias [C]`` (in ``out``'s dtype) with the bias gradient of :class:`_AddBias`."""
    if bias is None:
        return out
    return _AddBias.apply(out, bias.to(out.dtype))


def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer(x)`` with the bias added by :func:`add_bias` (same arithmetic, faster backward)."""
    if x.dim() != 2:
        return layer(x)
    return add_bias(F.linear(x, layer.weight), layer.bias)


def run_layers(layers: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """``x`` through ``layers`` in order, linear layers through :func:`linear`."""
    for layer in layers:
        x = linear(x, layer) if isinstance(layer, nn.Linear) else layer(x)
    return x


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

    @property
    def first(self) -> nn.Linear:
        """The first linear layer (what :func:`first_layer` runs on the unconcatenated input)."""
        lin = self[0]
        assert isinstance(lin, nn.Linear)  # (every MLP starts with one)
        return lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_layers(tuple(self), x)


class CrossNetwork(nn.Module):
    """DCN cross layers: ``x_{l+1} = x_0 * (x_l . w_l) + b_l + x_l`` (Wang et al., 2017).

    ``backend`` ("torch" or "triton", set by :meth:`hetgmp.models.DCN.use_kernels`) is how
    :meth:`logit` computes; :meth:`forward` is always the layers one by one in torch.
    """

    backend: str = "torch"

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

    def logit(self, xa: torch.Tensor, xb: torch.Tensor | None, u: torch.Tensor) -> torch.Tensor:
        """``forward([xa, xb]) . u`` per row as float32 ``[B, 1]`` (DCN's cross logit) on
        :attr:`backend`; the Triton kernels never build the concatenated input or any ``x_l``
        (:mod:`hetgmp.models.cross`)."""
        from hetgmp.models.cross import cross_logit

        y = cross_logit(xa, xb, list(self.weights), list(self.biases), u, self.backend)
        return y.unsqueeze(1)


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
    emb: torch.Tensor, dense: torch.Tensor | None, linears: Sequence[nn.Linear], *, pad_to: int = 8
) -> torch.Tensor:
    """The outputs of several ``nn.Linear`` layers over the same input ``flat_inputs(emb,
    dense)``, side by side (``[B, sum of out_features + padding]``), in one matrix product
    and without materialising the concatenated input.

    Why each choice (WDL, batch 65536, dim 128, measured on an H200 with
    ``bench/gpu/dense_probe.py``):

    - no concatenation: the ``[B, F*D + num_dense]`` input is 876 MB; concatenating it
      (forward) and slicing its gradient back (backward) are two copies of it, and the
      embedding's gradient arrives contiguous, so it reshapes to ``[B, F, D]`` for free;
    - one product for several layers (WDL's wide logit and the deep part's first layer): one
      pass over the input, and one input-sized gradient instead of two to add;
    - the weights are copied into contiguous blocks and the outputs (and the dense features)
      padded with zeros to a multiple of ``pad_to``: cuBLAS takes its slow "align1" kernels when a leading dimension
      is not a multiple of 4 floats (a slice of a ``[257, 3341]`` weight, a ``[B, 257]``
      output); those three products took 4.0 of the dense step's 5.3 ms.

    The padding rows are constants (zero outputs, no parameters); callers slice them away.
    """
    b, f, d = emb.shape
    flat = emb.reshape(b, f * d)
    k = f * d
    rows = sum(lin.out_features for lin in linears)
    pad = (-rows) % pad_to
    w0 = linears[0].weight

    def block(cols: slice, width: int) -> torch.Tensor:
        parts = [lin.weight[:, cols] for lin in linears]
        return torch.cat([*parts, w0.new_zeros(pad, width)] if pad else parts)

    biases: list[torch.Tensor] = [lin.bias for lin in linears]
    bias = torch.cat([*biases, w0.new_zeros(pad)] if pad else biases)
    if deferred_wgrad.wanted(flat, linears):  # (the weights' product after the embedding's)
        out = deferred_wgrad.first_product(flat, block(slice(0, k), k), linears, k)
    else:
        out = F.linear(flat, block(slice(0, k), k))
    n_dense = w0.shape[1] - k
    if n_dense and dense is not None and dense.shape[1]:
        w_dense = block(slice(k, None), n_dense).to(out.dtype)
        x = dense.to(out.dtype)
        if n_dense % pad_to:  # (13 Criteo dense features: the align1 kernels again, 0.02 ms)
            x, w_dense = F.pad(x, (0, -n_dense % pad_to)), F.pad(w_dense, (0, -n_dense % pad_to))
        out = torch.addmm(out, x, w_dense.t())
    return add_bias(out, bias)
