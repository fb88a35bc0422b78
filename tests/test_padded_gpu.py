"""The padded exchange with CUDA graphs on 2 GPUs (NCCL) equals the exact exchange."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_padded_exchange_with_cuda_graphs_on_two_gpus() -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", str(ROOT / "tests" / "gpu_padded_check.py")]  # fmt: skip
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert got.returncode == 0 and "PADDED GPU CHECK OK" in got.stdout, got.stdout + got.stderr
