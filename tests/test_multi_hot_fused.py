"""Training a multi-hot data set on the fused pooling kernels (issue 34) ends where the torch
pooling's CPU run ends: ``tests/gpu_multi_hot_check.py``, run in Triton's interpreter on CPU
(every push) and on one GPU with ``hetgmp.train.multi_hot.GPU_ONE_RANK`` on (``-m gpu``, the
device machine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
OK = "MULTI HOT CHECK OK"


def _check(tmp_path: Path, device: str, interpret: bool, samples: int = 3000) -> str:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if interpret:  # (read by triton at its import: the script's own process)
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, str(ROOT / "tests" / "gpu_multi_hot_check.py"), str(tmp_path / "d"),
           "--device", device, "--samples", str(samples)]  # fmt: skip
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert got.returncode == 0 and OK in got.stdout, got.stdout + got.stderr
    return got.stdout


def test_fused_pooling_trains_as_torch_pooling_in_interpreter(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    # (640 samples, 64 of them validation ones: the interpreter's cost is per program)
    out = _check(tmp_path, "cpu", interpret=True, samples=640)
    assert "adagrad sum,mean: cpu triton == cpu torch" in out
    assert "sgd mean,sum: cpu triton == cpu torch" in out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_gpu_multi_hot_equals_cpu_run(tmp_path: Path) -> None:
    """The GPU run with the switch on: rows, optimizer state, dense layers and validation
    loss of the CPU run; the whole-step graph refused by name, the dense part replayed."""
    out = _check(tmp_path, "cuda", interpret=False)
    assert "cuda triton == cpu torch" in out
