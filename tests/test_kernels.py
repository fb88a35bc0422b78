"""The fused row-update kernel (hetgmp.embedding.kernels) against its torch reference.

On CPU the Triton kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, set before
Triton is first imported, in a subprocess so the rest of the suite is not affected); the same
comparisons run compiled on a GPU when one is present (marker ``gpu``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hetgmp.embedding.kernels import resolve, scatter_add_rows, scatter_add_rows_reference

pytest.importorskip("triton")

CASES = textwrap.dedent(
    """
    import torch
    from hetgmp.embedding.kernels import scatter_add_rows, scatter_add_rows_reference

    def check(device):
        g = torch.Generator().manual_seed(0)
        # dims: power of two, not one (masked tail), > the 128-column tile (two tiles)
        for rows, n, d in ((50, 300, 16), (7, 1000, 20), (40, 257, 200), (3, 0, 8)):
            table = torch.randn(rows, d, generator=g).to(device)
            # hot rows: ids u^4-distributed, most hits on a few rows; int64 and int32 ids
            for dtype in (torch.int64, torch.int32):
                idx = (torch.rand(n, generator=g) ** 4 * rows).to(dtype).to(device)
                src = torch.randn(n, d, generator=g).to(device)
                want = scatter_add_rows_reference(table.clone(), idx.long(), src, -0.1)
                got = scatter_add_rows(table.clone(), idx, src, -0.1, backend="triton")
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
                # it is an in-place update of the table given
                t = table.clone()
                assert scatter_add_rows(t, idx, src, 1.0, backend="triton") is t
        print("ok")

    def check_runtime():
        # the runtime wired to the kernel: same rows as with the torch backend (1 rank, both
        # optimizers; the world-1 path adds every occurrence, so hot rows repeat)
        from hetgmp.comm.env import DistEnv
        from hetgmp.embedding import DistributedEmbedding

        g = torch.Generator().manual_seed(1)
        batches = [(torch.rand(16, 3, generator=g) ** 4 * 40).long() for _ in range(4)]
        for opt in ("sgd", "adagrad"):
            embs = [
                DistributedEmbedding(40, 8, DistEnv.single(), optimizer=opt, lr=0.1, kernels=k)
                for k in ("torch", "triton")
            ]
            assert embs[1].kernels == "triton"
            for ids in batches:
                for e in embs:
                    e(ids).pow(2).sum().backward()
            for e in embs:
                e.flush()
            torch.testing.assert_close(embs[1].weight, embs[0].weight, rtol=1e-5, atol=1e-6)
        print("ok")
    """
)


def test_triton_kernel_matches_reference_in_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    code = CASES + "\ncheck('cpu')\ncheck_runtime()\n"
    p = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0 and p.stdout.split() == ["ok", "ok"], p.stdout + p.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_kernel_matches_reference_on_gpu() -> None:
    ns: dict = {}
    exec(CASES, ns)  # noqa: S102 - the same cases, compiled
    ns["check"]("cuda")


def test_resolve() -> None:
    cpu = torch.device("cpu")
    assert resolve("torch", cpu) == "torch"
    if os.environ.get("TRITON_INTERPRET") != "1":
        assert resolve("auto", cpu) == "torch"  # auto never runs the interpreter
        with pytest.raises(ValueError, match="needs CUDA"):
            resolve("triton", cpu)
    with pytest.raises(ValueError, match="kernels must be one of"):
        resolve("fast", cpu)


def test_torch_backend_is_index_add() -> None:
    t = torch.zeros(4, 3)
    idx = torch.tensor([1, 1, 3])
    src = torch.ones(3, 3)
    scatter_add_rows(t, idx, src, 2.0, backend="torch")
    assert t[1].tolist() == [4.0] * 3 and t[3].tolist() == [2.0] * 3 and t[0].sum() == 0
    assert scatter_add_rows_reference(t, idx[:0], src[:0]) is t  # empty: untouched, no call
