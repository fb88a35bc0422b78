"""The fused kernels of hetgmp/embedding/padded/local_now.py (a batch's gradient on the rows
stored here, at the end of its step; the stored rows read again when the next step takes its
primed rows) against their torch reference in the same module, in Triton's interpreter
(``TRITON_INTERPRET=1`` must be set before triton is imported: a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    from types import SimpleNamespace
    import torch
    from hetgmp.embedding.optim import SparseOptimizer
    from hetgmp.embedding.padded import local_now

    def case(sw, kernels, w=3, rank=1, d=6, u=40, n_own=20, n_mir=9, seed=0):
        g = torch.Generator().manual_seed(seed)
        rows = n_own + n_mir
        store = SimpleNamespace(
            weight_full=torch.randn(rows + 1, d, generator=g),
            opt_state_full=torch.rand(rows + 1, generator=g) + 0.1,
            delta_acc_full=torch.randn(n_mir + 1, d, generator=g),
            grad_acc_full=torch.randn(n_mir + 1, d, generator=g),
            n_own=n_own, n_mir=n_mir, trash_slot=rows,
        )
        opt = SparseOptimizer("adagrad" if sw else "sgd", 0.3, eps=1e-6)
        st = SimpleNamespace(store=store, cap=SimpleNamespace(u=u), w=w, rank=rank, d=d,
                             sw=opt.state_width, opt=opt, lr=0.3, kernels=kernels)
        # block order: 7 own rows, mirrors of owners 0 and 2 (3 + 2), 6 rows not stored,
        # then padding entries (they repeat ids: slots of stored rows, never updated)
        blocks = torch.tensor([0, 7, 0, 3, 0, 2, 4, 0, 2])
        own = torch.randperm(n_own, generator=g)[:7]
        mir = n_own + torch.randperm(n_mir, generator=g)[:5]
        slot = torch.cat([own, mir, torch.full((6,), -1), own[:3]])
        slot = torch.cat([slot, torch.full((u + 5 - slot.numel(),), -1)])
        prep = SimpleNamespace(blocks=blocks, slot=slot, u=torch.zeros(u + 5, dtype=torch.long))
        grad = torch.randn(u + 1, d, generator=g)
        values = torch.randn(u + 1, d, generator=g)
        return st, prep, grad, values

    for sw in (0, 1):
        out = {}
        for k in ("torch", "triton"):
            st, prep, grad, values = case(sw, k)
            local_now.apply_stored(st, prep, grad)
            local_now.refresh_stored(st, prep, values)
            e = st.store
            out[k] = [e.weight_full, e.opt_state_full, e.delta_acc_full[:-1],
                      e.grad_acc_full[:-1], grad, values]
        for name, a, b in zip(["weight", "state", "delta", "gacc", "grad", "values"],
                              out["torch"], out["triton"]):
            if name in ("weight", "state"):  # (the torch ops' trash row is scratch)
                a, b = a[:-1], b[:-1]
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"sw={sw} {name}")
        st, prep, grad, _ = case(sw, "torch")
        assert grad[:12].abs().sum() > 0
        local_now.apply_stored(st, prep, grad)
        assert grad[:12].abs().sum() == 0 and grad[12:18].abs().sum() > 0  # (stored zeroed)
    print("LOCAL NOW KERNELS OK")
    """
)


def test_fused_local_now_matches_the_torch_ops() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    got = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env
    )
    assert got.returncode == 0 and "LOCAL NOW KERNELS OK" in got.stdout, got.stdout + got.stderr
