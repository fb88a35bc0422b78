"""The fused DCN cross kernels (:mod:`hetgmp.models.cross`) against the layer-by-layer torch
reference: run by ``tests/test_dcn_cross.py`` in Triton's interpreter on CPU (a subprocess with
``TRITON_INTERPRET=1``) and compiled on a GPU (marker ``gpu``), where it also replays the
forward + backward as a CUDA graph.

    TRITON_INTERPRET=1 python tests/dcn_cross_cases.py cpu
    python tests/dcn_cross_cases.py cuda
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from hetgmp.models import build_model
from hetgmp.models.cross import BF16_TILES, TILES, Tiles, cross_logit

SMALL = Tiles(8, 32, 8, 32, 8)  # several column tiles, row groups and row steps per group
# (B, Ka, Kb, L, dtype of the rows, tiles); Kb None: no dense columns
CASES = [
    # widths not multiples of the tiles, B not either (20: 3 forward programs, 2 row groups of
    # 2 and 1 row steps)
    (20, 70, 3, 3, torch.float32, SMALL),
    (20, 70, 3, 3, torch.bfloat16, SMALL),
    (37, 64, None, 1, torch.float32, Tiles(16, 32, 16, 32, 4)),  # width a multiple of the tile
    (9, 45, 20, 4, torch.bfloat16, Tiles(4, 16, 4, 16, 64)),  # L + 1 = 5 (padded to 8),
    # dense wider than a tile; one row group per row step
    (1, 300, 13, 3, torch.float32, TILES),  # the default tiles, one row
    (40, 300, 13, 3, torch.bfloat16, BF16_TILES),  # bf16's default tiles
    (0, 10, 2, 3, torch.float32, SMALL),  # empty batch
]


def make_inputs(b: int, ka: int, kb: int | None, nl: int, dtype: torch.dtype, device: str):
    """Rows, dense columns, cross weights, biases and ``u``, scaled so the cross terms matter
    (``a_l`` moves well away from 1), as leaves that require gradients."""
    g = torch.Generator().manual_seed(b * 1000 + ka)
    k = ka + (kb or 0)
    xa = torch.randn(b, ka, generator=g).to(dtype)
    xb = None if kb is None else torch.randn(b, kb, generator=g).to(dtype)
    ws = [torch.randn(k, generator=g) * 0.15 for _ in range(nl)]
    bs = [torch.randn(k, generator=g) * 0.2 for _ in range(nl)]
    u = torch.randn(k, generator=g)
    leaves = [xa, xb, *ws, *bs, u]
    return [None if t is None else t.to(device).requires_grad_() for t in leaves]


def run(leaves: list, nl: int, backend: str, tiles: Tiles, gy: torch.Tensor) -> list:
    """Logits and every leaf's gradient (``None`` for a missing ``xb``)."""
    for t in leaves:
        if t is not None:
            t.grad = None
    xa, xb, ws, bs, u = (
        leaves[0],
        leaves[1],
        leaves[2 : 2 + nl],
        leaves[2 + nl : 2 + 2 * nl],
        leaves[-1],
    )
    y = cross_logit(xa, xb, ws, bs, u, backend, tiles)
    assert y.dtype == torch.float32 and y.shape == (xa.shape[0],)
    y.backward(gy)
    return [y.detach(), *(None if t is None else t.grad for t in leaves)]


def close(got: torch.Tensor, want: torch.Tensor, rtol: float, what: str) -> None:
    """Equal up to ``rtol`` of the larger of 1 and ``want``'s largest magnitude."""
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype)
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    err = float((got.float() - want.float()).abs().max()) if want.numel() else 0.0
    assert err <= rtol * scale, f"{what}: max error {err:.3g} > {rtol} * {scale:.3g}"


def check_kernel(device: str) -> None:
    names = ["y", "dxa", "dxb"]
    for b, ka, kb, nl, dtype, tiles in CASES:
        leaves = make_inputs(b, ka, kb, nl, dtype, device)
        gy = torch.randn(b, generator=torch.Generator().manual_seed(7)).to(device)
        want = run(leaves, nl, "torch", tiles, gy)
        got = run(leaves, nl, "triton", tiles, gy)
        # (determinism: on a GPU; the interpreter runs the programs one by one in one order)
        again = run(leaves, nl, "triton", tiles, gy) if device != "cpu" else got
        labels = names + [f"dw{i}" for i in range(nl)] + [f"db{i}" for i in range(nl)] + ["du"]
        for what, g, w, a in zip(labels, got, want, again, strict=True):
            if w is None:
                assert g is None, what
                continue
            # rows' gradients in bf16: one rounding of nearly equal float32 values
            low = w.dtype == torch.bfloat16
            close(g, w, 2e-2 if low else 2e-5, f"{(b, ka, kb, nl, dtype)} {what}")
            assert torch.equal(g, a), f"{what}: not deterministic"  # two-stage sums, no atomics
        # the cross terms matter: a network without them gives other logits
        if b:
            plain = (leaves[0].detach().float() @ leaves[-1].detach()[:ka]).cpu()
            assert (want[0].cpu() - plain).abs().max() > 0.1
    print("ok")


class _Rows16(nn.Module):
    """An embedding whose rows come in bf16 (as the autocast lookup hands them over)."""

    def __init__(self) -> None:
        super().__init__()
        self.e = nn.Embedding(50, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.e(ids).to(torch.bfloat16)


def check_model(device: str) -> None:
    """DCN on the fused kernels == DCN on torch: logits and every parameter's gradient, fp32
    rows and bf16 rows under autocast."""
    g = torch.Generator().manual_seed(3)
    # (17 samples: 2 programs of the default 16 rows, the last one partial)
    sparse = torch.randint(0, 50, (17, 3), generator=g).to(device)
    dense = torch.rand(17, 2, generator=g).to(device)
    for amp in (False, True):
        models = []
        for backend in ("torch", "triton"):
            torch.manual_seed(0)
            emb = _Rows16() if amp else nn.Embedding(50, 4)
            m = build_model("dcn", emb, num_fields=3, num_dense=2, embed_dim=4).to(device)
            with torch.no_grad():  # cross terms that matter (the init keeps them tiny)
                for p in [*m.cross.weights, *m.cross.biases]:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(5)) * 0.3)
            assert m.use_kernels(backend, torch.device(device)) == backend
            with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
                logits = m(sparse, dense)
            logits.float().pow(2).sum().backward()
            models.append((logits.detach(), dict(m.named_parameters())))
        (lt, pt), (lk, pk) = models
        close(lk, lt, 1e-2 if amp else 1e-5, f"logits amp={amp}")
        for name, p in pt.items():
            close(pk[name].grad, p.grad, 2e-2 if amp else 1e-5, f"grad {name} amp={amp}")
    print("ok")


def check_graph(device: str) -> None:
    """Forward + backward captured in a CUDA graph and replayed == eager."""
    b, ka, kb, nl = 4096, 3328, 13, 3
    leaves = make_inputs(b, ka, kb, nl, torch.bfloat16, device)
    gy = torch.randn(b, device=device)
    want = run(leaves, nl, "triton", TILES, gy)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(leaves, nl, "triton", TILES, gy)  # (warm-up on the side stream)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    for t in leaves:
        t.grad = None
    with torch.cuda.graph(graph):
        xa, xb = leaves[0], leaves[1]
        y = cross_logit(xa, xb, leaves[2:5], leaves[5:8], leaves[-1], "triton", TILES)
        y.backward(gy)
    graph.replay()
    torch.cuda.synchronize()
    got = [y, *(t.grad for t in leaves)]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"graph replay differs from eager at output {i}"
    print("ok")


def main(device: str) -> None:
    # the torch references in full float32 (TF32 products would differ by ~1e-3)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        check_kernel(device)
        check_model(device)
        if device == "cuda":
            check_graph(device)
    finally:
        torch.set_float32_matmul_precision(precision)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
