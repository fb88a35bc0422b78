"""DCN's fused cross network (:mod:`hetgmp.models.cross`): the Triton kernels against the
layer-by-layer torch reference (``tests/dcn_cross_cases.py``: in Triton's interpreter on CPU,
compiled on a GPU), the algebra they rest on, and how ``--kernels`` picks the backend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hetgmp.models import build_model
from hetgmp.models import cross as C
from hetgmp.models.layers import CrossNetwork

CASES = Path(__file__).with_name("dcn_cross_cases.py")
ROOT = CASES.parents[1]


def test_kernels_match_reference_in_interpreter() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, str(CASES), "cpu"], env=env, capture_output=True, text=True, timeout=400
    )
    assert p.returncode == 0 and p.stdout.split() == ["ok"] * 2, p.stdout + p.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernels_match_reference_on_gpu() -> None:
    pytest.importorskip("triton")
    sys.path.insert(0, str(CASES.parent))
    import dcn_cross_cases

    dcn_cross_cases.main("cuda")  # the same cases compiled, and a CUDA graph replay


def _factored(xa, xb, weights, biases, u):  # noqa: ANN001, ANN202
    """The kernels' algebra in torch: ``P = x0 @ [w; u]^T``, the per-row recurrence on
    ``a_l``, and the weight-only ``q`` of :func:`hetgmp.models.cross._weight_terms`."""
    x0 = torch.cat([xa, xb], 1)
    wcat, q = C._weight_terms(weights, biases, u)
    p = x0 @ wcat.t()
    a = torch.ones(x0.shape[0], dtype=torch.float64)
    for j in range(len(weights)):
        a = a + a * p[:, j] + q[j]
    return a * p[:, -1] + q[-1]


def test_the_algebra_equals_the_layers() -> None:
    # x_l = x0 * a_l + c_l: the identity the kernels compute, checked in float64 with torch
    g = torch.Generator().manual_seed(0)
    xa, xb = torch.randn(20, 11, generator=g).double(), torch.randn(20, 2, generator=g).double()
    ws = [torch.randn(13, generator=g).double() * 0.3 for _ in range(4)]
    bs = [torch.randn(13, generator=g).double() * 0.3 for _ in range(4)]
    u = torch.randn(13, generator=g).double()
    want = C.cross_logit_reference(xa, xb, ws, bs, u)
    torch.testing.assert_close(_factored(xa, xb, ws, bs, u), want, rtol=1e-12, atol=1e-12)
    # and the torch backend is the CrossNetwork followed by the output projection
    net = CrossNetwork(13, 4).double()
    with torch.no_grad():
        for p, v in zip([*net.weights, *net.biases], [*ws, *bs], strict=True):
            p.copy_(v)
    got = net.logit(xa, xb, u)
    torch.testing.assert_close(got, F.linear(net(torch.cat([xa, xb], 1)), u[None]), rtol=0, atol=0)


def test_bad_input_is_a_clear_error() -> None:
    ws, bs, u = [torch.zeros(5)] * 2, [torch.zeros(5)] * 2, torch.zeros(5)
    with pytest.raises(ValueError, match="width 5 got inputs 6 wide"):
        C.cross_logit(torch.zeros(3, 4), torch.zeros(3, 2), ws, bs, u)
    with pytest.raises(ValueError, match=r"must be \[B, Ka\] and \[B, Kb\]"):
        C.cross_logit(torch.zeros(3, 4), torch.zeros(2, 1), ws, bs, u)
    with pytest.raises(ValueError, match="backend must be"):
        C.cross_logit(torch.zeros(3, 4), torch.zeros(3, 1), ws, bs, u, "cuda")


def test_resolve_cross_policy(monkeypatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert C.resolve_cross("torch", cuda) == "torch"
    assert C.resolve_cross("auto", cpu) == "torch"  # CPU keeps the torch path
    with pytest.raises(ValueError, match="kernels must be one of"):
        C.resolve_cross("fast", cpu)
    if os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(ValueError, match="needs CUDA"):
            C.resolve_cross("triton", cpu)
    # Triton does not import on a CUDA machine: auto says so and uses torch, triton raises
    monkeypatch.setattr(C, "_triton", lambda: "ImportError: no triton")
    with pytest.warns(UserWarning, match="no triton.*using torch"):
        assert C.resolve_cross("auto", cuda) == "torch"
    with pytest.raises(RuntimeError, match="do not run here: ImportError"):
        C.resolve_cross("triton", cuda)
    # it imports but its trial run fails (no C compiler, a wrong result): the same
    monkeypatch.setattr(C, "_triton", lambda: object())
    monkeypatch.setattr(C, "_trial", lambda device: "wrong result in a trial run")
    with pytest.warns(UserWarning, match="wrong result"):
        assert C.resolve_cross("auto", cuda) == "torch"
    with pytest.raises(RuntimeError, match="wrong result"):
        C.resolve_cross("triton", cuda)
    monkeypatch.setattr(C, "_trial", lambda device: None)
    assert C.resolve_cross("auto", cuda) == "triton"


def test_only_dcn_has_dense_kernels() -> None:
    cpu = torch.device("cpu")
    for name in ("wdl", "dfm", "dlrm"):
        dim = 5 if name == "dfm" else 4
        m = build_model(name, nn.Embedding(10, dim), num_fields=2, num_dense=1, embed_dim=4)
        assert m.use_kernels("auto", cpu) is None
    m = build_model("dcn", nn.Embedding(10, 4), num_fields=2, num_dense=1, embed_dim=4)
    assert m.use_kernels("auto", cpu) == "torch" and m.cross.backend == "torch"
    assert m.cross_dim == 9 and "backend" not in str(m.dense_state_dict().keys())
