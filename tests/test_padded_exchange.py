"""The padded exchange equals the exact one over many steps with growing capacities: on 2 CPU
ranks (gloo) and, with ``-m gpu`` on 2 GPUs, with NCCL and CUDA graphs (tests/gpu_padded_check.py
under torchrun)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _run(device: str) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", str(ROOT / "tests" / "gpu_padded_check.py"), device]  # fmt: skip
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert got.returncode == 0 and "PADDED CHECK OK" in got.stdout, got.stdout + got.stderr


def test_padded_exchange_over_many_steps_on_cpu_ranks() -> None:
    _run("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_padded_exchange_with_cuda_graphs_on_two_gpus() -> None:
    _run("cuda")


def _losses(env, exchange: str) -> dict:
    """A few steps whose gradients arrive in other forms than the harness's contiguous
    tensor: the expanded gradient of ``.sum()`` (not contiguous), a bf16 gradient, and two
    backward passes through one output (the second replaces the first, as with one rank)."""
    import numpy as np

    from hetgmp.embedding import DistributedEmbedding
    from hetgmp.partition.plan import Plan

    rng = np.random.default_rng(3)
    owner = rng.integers(0, 2, 50).astype(np.int32)
    plan = Plan(np.zeros(2, np.int32), owner, [np.flatnonzero(owner != w) for w in range(2)], {})
    emb = DistributedEmbedding(
        50, 4, env, plan, store_rate=0.3, bound=1, optimizer="sgd", lr=0.1, replies="all",
        exchange=exchange,
    )  # fmt: skip
    emb.peers_full(True)  # (every rank's batch full: the pre-sync path may run)
    g = torch.Generator().manual_seed(env.rank)
    for step in range(8):
        out = emb((torch.rand(6, 3, generator=g) ** 2 * 50).long())
        if step % 3 == 0:
            out.sum().backward()
        elif step % 3 == 1:
            out.to(torch.bfloat16).pow(2).sum().backward()
        else:
            out.pow(2).sum().backward(retain_graph=True)
            (3 * out).sum().backward()
    return emb.state_dict()


def test_padded_gradient_forms_match_exact() -> None:
    from hetgmp.comm.spawn import spawn_ranks

    exact = spawn_ranks(_losses, 2, "exact", timeout_s=120)
    padded = spawn_ranks(_losses, 2, "padded", timeout_s=120)
    for a, b in zip(exact, padded, strict=True):
        assert torch.equal(a["ids"], b["ids"])
        torch.testing.assert_close(b["weight"], a["weight"], rtol=1e-5, atol=1e-6)
