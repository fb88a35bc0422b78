"""CTR models: shapes, gradients reaching every parameter, and layers against slow references."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hetgmp.models import MODELS, DeepFM, build_model, model_class
from hetgmp.models.layers import CrossNetwork, dot_interaction


def _inputs(b: int, f: int, rows: int, nd: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    sparse = torch.randint(0, rows, (b, f), generator=g)
    dense = torch.rand(b, nd, generator=g) if nd else None
    return sparse, dense


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("num_dense", [0, 3])
def test_forward_backward_shapes(name: str, num_dense: int) -> None:
    torch.manual_seed(0)
    cls = model_class(name)
    emb = nn.Embedding(40, cls.table_dim(8))
    model = build_model(name, emb, num_fields=5, num_dense=num_dense, embed_dim=8)
    sparse, dense = _inputs(6, 5, 40, num_dense)
    out = model(sparse, dense)
    assert out.shape == (6, 1)
    out.sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
    # dense parameters exclude the embedding table
    ids = {id(p) for p in model.dense_parameters()}
    assert id(emb.weight) not in ids
    assert len(ids) == len(list(model.parameters())) - 1


@pytest.mark.parametrize("name", sorted(MODELS))
def test_empty_batch(name: str) -> None:
    """A rank with no batch left still runs forward/backward on an empty batch."""
    emb = nn.Embedding(10, model_class(name).table_dim(4))
    model = build_model(name, emb, num_fields=2, num_dense=1, embed_dim=4)
    out = model(torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 1))
    assert out.shape == (0, 1)
    out.sum().backward()


def test_dlrm_shapes_follow_nvidia() -> None:
    model = build_model("dlrm", nn.Embedding(10, 16), num_fields=26, num_dense=13, embed_dim=16)
    widths = [m.out_features for m in model.bottom if isinstance(m, nn.Linear)]
    assert widths == [512, 256, 16]
    top = [m.out_features for m in model.top if isinstance(m, nn.Linear)]
    assert top == [1024, 1024, 512, 256, 1]
    assert model.top[0].in_features == 27 * 26 // 2 + 16


def test_dot_interaction_matches_loops() -> None:
    x = torch.randn(3, 4, 5)
    got = dot_interaction(x)
    want = torch.stack(
        [torch.stack([x[b, i] @ x[b, j] for i in range(4) for j in range(i)]) for b in range(3)]
    )
    torch.testing.assert_close(got, want)


def test_cross_network_matches_formula() -> None:
    torch.manual_seed(1)
    net = CrossNetwork(6, 2)
    x0 = torch.randn(4, 6)
    want = x0.clone()
    for w, b in zip(net.weights, net.biases, strict=True):
        want = torch.stack([x0[i] * (want[i] @ w) + b + want[i] for i in range(4)])
    torch.testing.assert_close(net(x0), want)


def test_deepfm_fm_and_first_order_terms() -> None:
    """With the deep part and dense linear zeroed, DeepFM = sum of first-order weights + pairwise
    dot products of field vectors (the FM definition, computed by loops)."""
    torch.manual_seed(2)
    emb = nn.Embedding(20, DeepFM.table_dim(3))
    model = build_model("dfm", emb, num_fields=4, num_dense=2, embed_dim=3)
    with torch.no_grad():
        for p in model.deep_out.parameters():
            p.zero_()
        for p in model.dense_linear.parameters():
            p.zero_()
    sparse, dense = _inputs(5, 4, 20, 2, seed=3)
    got = model(sparse, dense)
    rows = emb.weight[sparse].detach()
    want = []
    for b in range(5):
        v, w = rows[b, :, :3], rows[b, :, 3]
        pair = sum(v[i] @ v[j] for i in range(4) for j in range(i + 1, 4))
        want.append(w.sum() + pair)
    torch.testing.assert_close(got.detach().ravel(), torch.stack(want))


def test_wrong_embedding_width_is_a_clear_error() -> None:
    model = build_model("dfm", nn.Embedding(10, 4), num_fields=2, num_dense=0, embed_dim=4)
    with pytest.raises(ValueError, match="first-order"):
        model(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="unknown model"):
        model_class("xgboost")


def test_dense_state_roundtrip_and_mismatch() -> None:
    a = build_model("wdl", nn.Embedding(10, 4), num_fields=2, num_dense=1, embed_dim=4)
    b = build_model("wdl", nn.Embedding(10, 4), num_fields=2, num_dense=1, embed_dim=4)
    b.load_dense_state_dict(a.dense_state_dict())
    for k, v in a.dense_state_dict().items():
        assert torch.equal(v, b.dense_state_dict()[k])
    assert not any(k.startswith("embedding.") for k in a.dense_state_dict())
    c = build_model("dcn", nn.Embedding(10, 4), num_fields=2, num_dense=1, embed_dim=4)
    with pytest.raises(ValueError, match="does not fit"):
        c.load_dense_state_dict(a.dense_state_dict())


def _wdl_textbook(m, sparse, dense):
    from hetgmp.models.layers import flat_inputs

    x = flat_inputs(m.embedding(sparse), dense)
    return m.wide(x) + m.deep_out(m.deep(x))


def _deepfm_textbook(m, sparse, dense):

    from hetgmp.models.layers import flat_inputs

    table = m.embedding(sparse)
    vec, first = table[..., : m.embed_dim], table[..., m.embed_dim]
    logit = first.sum(dim=1, keepdim=True)
    if m.dense_linear is not None and dense is not None:
        logit = logit + m.dense_linear(dense)
    fm = 0.5 * (vec.sum(dim=1).pow(2) - vec.pow(2).sum(dim=1)).sum(dim=1, keepdim=True)
    return logit + fm + m.deep_out(m.deep(flat_inputs(vec, dense)))


def _dcn_textbook(m, sparse, dense):
    import torch

    from hetgmp.models.layers import flat_inputs

    x = flat_inputs(m.embedding(sparse), dense)
    return m.out(torch.cat([m.cross(x), m.deep(x)], dim=1))


@pytest.mark.parametrize("name", ["wdl", "dcn", "dfm"])
def test_first_layer_without_concatenation_equals_the_textbook_formula(name: str) -> None:
    """The deep part's first layer (with WDL's wide logit as one more output) and DCN's output
    layer run on the embedding and dense parts separately, on aligned weight copies with padded
    outputs: outputs and every gradient must equal the formula on the concatenated input."""
    import torch
    from torch import nn

    textbook = {"wdl": _wdl_textbook, "dcn": _dcn_textbook, "dfm": _deepfm_textbook}[name]
    torch.manual_seed(0)
    for num_dense in (3, 0):
        width = 5 if name == "dfm" else 4
        m = build_model(name, nn.Embedding(50, width), num_fields=6, num_dense=num_dense,
                        embed_dim=4).double()  # fmt: skip
        sparse = torch.randint(0, 50, (17, 6))
        dense = torch.randn(17, num_dense, dtype=torch.float64) if num_dense else None
        out = m(sparse, dense)
        out.pow(2).sum().backward()
        got = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        want = textbook(m, sparse, dense)
        want.pow(2).sum().backward()
        torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
        for g, p in zip(got, m.parameters(), strict=True):
            torch.testing.assert_close(g, p.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_bias_gradient_by_product_equals_nn_linear(dtype) -> None:
    from hetgmp.models.layers import linear

    torch.manual_seed(0)
    lin = torch.nn.Linear(12, 5).to(dtype)
    x = torch.randn(33, 12, dtype=dtype, requires_grad=True)
    up = torch.randn(33, 5, dtype=dtype)
    lin(x).backward(up)
    want = [t.grad.clone() for t in (x, lin.weight, lin.bias)]
    for t in (x, lin.weight, lin.bias):
        t.grad = None
    out = linear(x, lin)
    # (bf16: the bias is added after the product's rounding, not inside it: one more rounding)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 0, "atol": 0}
    torch.testing.assert_close(out, lin(x), **tol)
    out.backward(up)
    tol = tol if dtype == torch.bfloat16 else {}
    for got, w in zip((x.grad, lin.weight.grad, lin.bias.grad), want, strict=True):
        torch.testing.assert_close(got, w, **tol)
