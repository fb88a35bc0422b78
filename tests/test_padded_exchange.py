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
