"""WDL and DCN in plain PyTorch: the architectures of :mod:`hetgmp.models.ctr`, rebuilt by hand.

The plain-PyTorch contender of ``bench/gpu/plain_ctr.py`` must train the SAME network as
``examples/hetuctr.py`` (same layer widths, same wide part, same initialisation scale), but
without hetgmp's embedding, model classes or trainer, so that the comparison is "hetgmp vs what
a competent PyTorch user writes". ``tests/test_bench_train.py`` checks that the dense parameter
shapes equal hetgmp's for the same configuration, which catches drift on either side.

Every model is one fused ``nn.Embedding(num_rows, dim, sparse=True)`` (global ids, already offset
per field, so one table serves all fields) plus a ``head`` that maps the flat input
``[B, F * dim + num_dense]`` to logits ``[B, 1]``. The head is what ``--compile`` compiles: the
embedding's sparse gradient is not something inductor handles, and the lookup is one kernel.
"""

from __future__ import annotations

import torch
from torch import nn

# hetgmp.models.ctr: HETGMP_MLP = (256, 256, 256), DCN_CROSS_LAYERS = 3 (copied, not imported:
# the test compares shapes, so a change on either side fails loudly instead of silently following).
MLP_WIDTHS = (256, 256, 256)
CROSS_LAYERS = 3


def mlp(in_dim: int, widths: tuple[int, ...] = MLP_WIDTHS) -> nn.Sequential:
    """Linear + ReLU per width (ReLU after the last one too, as hetgmp's MLP for WDL/DCN)."""
    layers: list[nn.Module] = []
    for w in widths:
        layers += [nn.Linear(in_dim, w), nn.ReLU()]
        in_dim = w
    return nn.Sequential(*layers)


class WDLHead(nn.Module):
    """Wide & Deep head: a linear logit plus an MLP 256-256-256 and its output layer."""

    def __init__(self, in_dim: int) -> None:
        super().__init__()
        self.wide = nn.Linear(in_dim, 1)
        self.deep = mlp(in_dim)
        self.deep_out = nn.Linear(MLP_WIDTHS[-1], 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wide(x) + self.deep_out(self.deep(x))


class DCNHead(nn.Module):
    """Deep & Cross head: 3 cross layers beside the MLP, joined by one linear layer."""

    def __init__(self, in_dim: int) -> None:
        super().__init__()
        # randn * 0.01 and zero biases: hetgmp's CrossNetwork init (cross terms start near identity)
        self.cross_w = nn.ParameterList(
            [nn.Parameter(torch.randn(in_dim) * 0.01) for _ in range(CROSS_LAYERS)]
        )
        self.cross_b = nn.ParameterList(
            [nn.Parameter(torch.zeros(in_dim)) for _ in range(CROSS_LAYERS)]
        )
        self.deep = mlp(in_dim)
        self.out = nn.Linear(in_dim + MLP_WIDTHS[-1], 1)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for w, b in zip(self.cross_w, self.cross_b, strict=True):
            x = x0 * (x @ w).unsqueeze(1) + b + x
        return self.out(torch.cat([x, self.deep(x0)], dim=1))


HEADS: dict[str, type[nn.Module]] = {"wdl": WDLHead, "dcn": DCNHead}


class PlainCTR(nn.Module):
    """One fused sparse ``nn.Embedding`` for all fields + a dense head (WDL or DCN)."""

    def __init__(
        self,
        model: str,
        *,
        num_rows: int,
        num_fields: int,
        num_dense: int,
        embed_dim: int,
        init_scale: float = 0.01,
    ) -> None:
        super().__init__()
        if model not in HEADS:
            raise ValueError(f"--model {model!r}: choose one of {sorted(HEADS)}")
        self.num_fields, self.embed_dim = num_fields, embed_dim
        self.emb = nn.Embedding(num_rows, embed_dim, sparse=True)
        # uniform in [-s, s]: hetgmp's --init_scale (default 0.01), not nn.Embedding's N(0, 1)
        with torch.no_grad():
            self.emb.weight.uniform_(-init_scale, init_scale)
        self.head = HEADS[model](num_fields * embed_dim + num_dense)

    def flat(self, sparse: torch.Tensor, dense: torch.Tensor | None) -> torch.Tensor:
        """Concatenated embeddings [B, F * D] and dense features (hetgmp's ``flat_inputs``)."""
        e = self.emb(sparse)
        x = e.reshape(e.shape[0], self.num_fields * self.embed_dim)
        return x if dense is None else torch.cat([x, dense.to(x.dtype)], dim=1)

    def forward(self, sparse: torch.Tensor, dense: torch.Tensor | None) -> torch.Tensor:
        return self.head(self.flat(sparse, dense))

    def dense_parameters(self) -> list[nn.Parameter]:
        """Everything but the embedding table (what the dense optimizer trains)."""
        return list(self.head.parameters())
