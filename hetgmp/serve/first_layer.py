"""The dense part for inference, with its first layer laid out for a forward pass only.

Training computes a model's first layers (WDL: the deep part's 256 columns and the wide logit)
as one matrix product over ``[flat rows, dense]`` with the outputs padded to 264 columns
(:func:`hetgmp.models.layers.first_layer`): one pass over the input and one input-sized gradient
in the backward. Serving has no backward, and there the padding costs: cuBLAS's float32 kernels
tile 264 columns as if they were 320 or more. So :class:`InferenceFirstLayer`

* runs the *wide* layers (``out_features`` a multiple of 8: the deep layer) as one product with
  the weight blocks made once at load (serving weights do not change; training re-concatenates
  them every step, as they do change);
* computes the *narrow* ones (WDL's wide logit) as row reductions ``(flat * w).sum(1)``, which
  ``torch.compile`` fuses with the row gather: the rows are read once, for both;
* adds the dense features' product and the biases in the product's epilogue.

Same arithmetic in float32 (only the summation order differs, ~1e-7). Measured on an H200 by
``bench/gpu/serve_first_layer.py`` (CUDA graphs, GPU time per call, compiled): 1.16x / 1.19x /
1.24x faster than the training layout at batch 1024 / 8192 / 65536. The scorer uses it for
float32 only: with the dense part under bf16 autocast (``amp``) the tensor-core product of 264
columns is not the bottleneck, and the bf16 row reduction made the whole scorer slower (0.68x
the plain contender at batch 65536 instead of 1.19x, ``bench/gpu/inference.py``, 2026-11-25).

:func:`inference_head` wraps a :class:`~hetgmp.serve.program.DenseProgram` whose model has a
separable first layer (:meth:`~hetgmp.models.ctr.CTRModel.first_linears`); other models keep
their forward. With a dimension per field (issue 34) the first layer's input is the fields'
first ``d_f`` columns side by side (``sum d_f`` wide, not ``F * D``): the head takes them with the
model's own :meth:`~hetgmp.models.field_dims.FieldDims.flat`, as training's head does, before the
product.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hetgmp.models import CTRModel
from hetgmp.serve.program import DenseProgram

ALIGN = 8  # cuBLAS's fast float32 kernels want leading dimensions in multiples of 4 floats


class InferenceFirstLayer(nn.Module):
    """``forward(rows [B, F, D], dense [B, KD] | None) -> [B, N]``: the outputs of ``linears``
    over ``[rows flat, dense]``, side by side in their order (see the module docstring).
    The wide layers must come before the narrow ones (as in WDL: deep, then wide)."""

    def __init__(self, linears: Sequence[nn.Linear], row_width: int) -> None:
        super().__init__()
        wide = [lin for lin in linears if lin.out_features % ALIGN == 0]
        narrow = list(linears[len(wide) :])
        if list(linears[: len(wide)]) != wide:
            raise ValueError("InferenceFirstLayer: the narrow layers must come last")
        self.row_width = row_width

        def block(layers: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            w = torch.cat([lin.weight.detach() for lin in layers]).float()
            b = torch.cat([_bias(lin) for lin in layers]).float()
            dense = w[:, row_width:]  # [N, KD], padded to a multiple of ALIGN inputs
            dense = F.pad(dense, (0, -dense.shape[1] % ALIGN)).t().contiguous()
            return w[:, :row_width].contiguous(), dense, b

        self.has_wide, self.has_narrow = bool(wide), bool(narrow)
        empty = torch.zeros(0)
        for name, layers in (("wide", wide), ("narrow", narrow)):
            w, wd, b = block(layers) if layers else (empty, empty, empty)
            self.register_buffer(f"w_{name}", w, persistent=False)
            self.register_buffer(f"wd_{name}", wd, persistent=False)
            self.register_buffer(f"b_{name}", b, persistent=False)

    # (registered buffers, declared for the type checker)
    w_wide: torch.Tensor
    wd_wide: torch.Tensor
    b_wide: torch.Tensor
    w_narrow: torch.Tensor
    wd_narrow: torch.Tensor
    b_narrow: torch.Tensor

    def forward(self, rows: torch.Tensor, dense: torch.Tensor | None) -> torch.Tensor:
        b = rows.shape[0]
        flat = rows.reshape(b, self.row_width)
        x = None
        if dense is not None and dense.shape[1] and self.wd_wide.numel() + self.wd_narrow.numel():
            x = F.pad(dense.to(flat.dtype), (0, -dense.shape[1] % ALIGN))
        parts = []
        if self.has_wide:
            h = flat @ self.w_wide.t()
            if x is not None:
                h = h + x @ self.wd_wide.to(h.dtype)
            parts.append(h + self.b_wide.to(h.dtype))
        if self.has_narrow:  # (one row reduction per narrow output: fused with the gather)
            n = (flat.unsqueeze(1) * self.w_narrow.to(flat.dtype)).sum(2)
            if x is not None:
                n = n + x @ self.wd_narrow.to(n.dtype)
            parts.append(n + self.b_narrow.to(n.dtype))
        return parts[0] if len(parts) == 1 else torch.cat([p.to(parts[0].dtype) for p in parts], 1)


def _bias(lin: nn.Linear) -> torch.Tensor:
    return lin.bias.detach() if lin.bias is not None else lin.weight.new_zeros(lin.out_features)


class InferenceHead(nn.Module):
    """``forward(rows, dense) -> logits [B, 1]`` as the program's, through
    :class:`InferenceFirstLayer` and the model's :meth:`~hetgmp.models.ctr.CTRModel.from_first`."""

    def __init__(self, program: DenseProgram) -> None:
        super().__init__()
        model = program.model
        self.model, self.num_dense = model, program.num_dense
        self.first = InferenceFirstLayer(model.first_linears(), first_input_width(model))

    def forward(self, rows: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        rows = self.model.fields.flat(rows)  # (per-field dimensions: each field's d_f columns)
        return self.model.from_first(self.first(rows, dense if self.num_dense else None))


def rows_dim(model: CTRModel) -> int:
    """The width of the model's rows (``table_dim``)."""
    return type(model).table_dim(model.embed_dim)


def first_input_width(model: CTRModel) -> int:
    """How many row values per sample the first layer reads: ``sum d_f`` with a dimension per
    field, else every field's whole row (``F * table_dim``)."""
    if model.fields.dims is not None:
        return model.fields.flat_dim
    return model.num_fields * rows_dim(model)


def inference_head(program: nn.Module) -> nn.Module:
    """:class:`InferenceHead` over ``program`` when its model has a separable first layer, else
    ``program`` itself (an exported program, or a model that needs its rows further on)."""
    if isinstance(program, DenseProgram) and program.model.first_linears():
        return InferenceHead(program).to(next(program.parameters()).device)
    return program
