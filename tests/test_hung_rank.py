"""A rank that hangs must not keep an ``mpirun`` job alive: its peer's collective times out
(``--timeout-s``), the peer says so and ends the whole job (``MPI_Abort``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from mpirun_job import ROOT, mpirun_cli_job

# rank 1 stops itself (SIGSTOP, as a debugger or a stuck driver would) at its 5th training
# step (counted, not timed: start-up takes long on a loaded machine); rank 0's next collective
# then waits for it until --timeout-s
WRAPPER = textwrap.dedent(
    """
    import os, signal, sys

    if os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
        from hetgmp.train.trainer import Trainer

        run_step, steps = Trainer._run_step, []

        def stopping(self, *args, **kwargs):
            steps.append(1)
            if len(steps) == 5:
                os.kill(os.getpid(), signal.SIGSTOP)
            return run_step(self, *args, **kwargs)

        Trainer._run_step = stopping
    from hetgmp.train.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.mpi
def test_hung_rank_ends_the_mpirun_job(tiny_dataset, tmp_path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(WRAPPER)
    cmd, env = mpirun_cli_job(script, tiny_dataset.root, iters=100000, timeout_s=6)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired as e:  # the bug: mpirun waits for the stopped rank
        subprocess.run(["pkill", "-KILL", "-f", str(script)], check=False)
        pytest.fail(f"mpirun did not end: {e.stdout!r} {e.stderr!r}")
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "hetgmp: error on rank 0 of 2" in out and "MPI_Abort" in out, out
    assert elapsed < 120, elapsed


@pytest.mark.timeout(180)
def test_hung_rank_ends_the_torchrun_job(tiny_dataset, tmp_path) -> None:
    """The same under torchrun: the failing worker exits, and torchrun's agent ends the hung
    one (SIGTERM)."""
    script = tmp_path / "hang.py"
    # (here the rank hangs in a sleep, as a deadlock in Python code would: SIGTERM ends it at
    # once, where a stopped process waits out the agent's 30 s grace period before SIGKILL)
    script.write_text(
        WRAPPER.replace("OMPI_COMM_WORLD_RANK", "RANK").replace(
            "os.kill(os.getpid(), signal.SIGSTOP)", "__import__('time').sleep(10**6)"
        )
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(script), "--dataset", str(tiny_dataset.root), "--iter", "100000", "--batch_size",
        "8", "--timeout-s", "6", "--no-progress", "--no-val",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired as e:
        subprocess.run(["pkill", "-KILL", "-f", str(script)], check=False)
        pytest.fail(f"torchrun did not end: {e.stdout!r} {e.stderr!r}")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "hetgmp train: error: rank 0/2" in out, out
