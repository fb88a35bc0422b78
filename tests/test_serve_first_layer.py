"""The serving first layer (hetgmp.serve.first_layer) computes what the model computes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hetgmp.models import build_model
from hetgmp.serve.first_layer import InferenceFirstLayer, InferenceHead, inference_head
from hetgmp.serve.program import DenseProgram, RowsIdentity


def _program(name: str, num_dense: int, dims: tuple[int, ...] | None = None) -> DenseProgram:
    torch.manual_seed(0)
    model = build_model(
        name, RowsIdentity(), num_fields=5, num_dense=num_dense, embed_dim=16, field_dims=dims
    )
    for p in model.parameters():  # (non-zero biases: the bias path is checked too)
        nn.init.normal_(p, std=0.1)
    return DenseProgram(model).eval()


@pytest.mark.parametrize(("num_dense", "dims"), [(13, None), (0, None), (13, (16, 3, 8, 1, 5))])
def test_inference_head_equals_the_model_for_wdl(num_dense: int, dims) -> None:
    """Per-field dimensions too: the head reads each field's first d_f columns, as the model."""
    program = _program("wdl", num_dense, dims)
    head = inference_head(program)
    assert isinstance(head, InferenceHead)
    rows, dense = torch.randn(37, 5, 16), torch.randn(37, num_dense)
    with torch.inference_mode():
        want = program(rows, dense)
        got = head(rows, dense)
        compiled = torch.compile(head, dynamic=False)(rows, dense)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["dcn", "dfm", "dlrm"])
def test_models_that_need_their_rows_keep_their_forward(name: str) -> None:
    program = _program(name, 13)
    assert inference_head(program) is program


def test_first_layer_outputs_in_the_layers_order() -> None:
    torch.manual_seed(1)
    lins = [nn.Linear(3 * 4 + 2, 8), nn.Linear(3 * 4 + 2, 16), nn.Linear(3 * 4 + 2, 3)]
    first = InferenceFirstLayer(lins, 12)
    rows, dense = torch.randn(9, 3, 4), torch.randn(9, 2)
    x = torch.cat([rows.reshape(9, 12), dense], 1)
    want = torch.cat([lin(x) for lin in lins], 1)
    torch.testing.assert_close(first(rows, dense), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="narrow layers must come last"):
        InferenceFirstLayer([lins[2], lins[0]], 12)


def test_per_field_columns_are_made_before_compiling() -> None:
    """The fast path makes FieldDims' cached columns before compiling (compiled._rebuild):
    otherwise the first call traces their making and the second compiles the bucket again."""
    from torch._dynamo.utils import counters

    from hetgmp.serve.compiled import _cache_field_columns

    program = _program("wdl", 13, (16, 3, 8, 1, 5))
    _cache_field_columns(program)
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(inference_head(program), dynamic=False)
    with torch.inference_mode():
        for _ in range(3):
            step(torch.randn(8, 5, 16), torch.randn(8, 13))
    assert counters["stats"]["unique_graphs"] == 1
