"""Launcher detection from environment variables (hetgmp.comm.detect, issue 15 item 11).

Pure functions of a dict: Open MPI, MPICH / Intel MPI (Hydra), Slurm's srun, torchrun, and the
variables one launcher leaves behind for the next.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetgmp.comm.detect import (
    LaunchInfo,
    detect_launch,
    expand_tasks_per_node,
    slurm_first_host,
    slurm_rendezvous,
)
from hetgmp.comm.errors import LaunchError

ROOT = Path(__file__).resolve().parent.parent

SRUN = {  # task 5 of `srun -N 2 --ntasks-per-node 4`, second node
    "SLURM_JOB_ID": "812345",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "8",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}
BATCH = {  # the batch script's own shell of `sbatch -N 2 -n 8`: no step variables
    "SLURM_JOB_ID": "812345",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "8",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_TASKS_PER_NODE": "4(x2)",
}
HYDRA = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
OMPI = {
    "OMPI_COMM_WORLD_RANK": "2",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "x",
    "RANK": "6",
    "WORLD_SIZE": "16",
    "LOCAL_RANK": "2",
    "LOCAL_WORLD_SIZE": "8",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


def test_srun():
    port = 15000 + (16 * 812345 + 0) % 20000
    assert detect_launch(SRUN) == LaunchInfo("srun", 5, 8, 1, 4, "gpu07", port)
    # MASTER_ADDR / MASTER_PORT win over the derived rendezvous
    env = {**SRUN, "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29400"}
    assert detect_launch(env) == LaunchInfo("srun", 5, 8, 1, 4, "10.1.2.3", 29400)
    one = {
        **SRUN,
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_STEP_TASKS_PER_NODE": "1",
    }
    assert detect_launch(one) == LaunchInfo("srun", 0, 1, 0, 1)


def test_a_batch_script_is_one_process():
    assert detect_launch(BATCH).launcher == "single"
    assert detect_launch(BATCH).world_size == 1


def test_mpich_and_intel_mpi():
    assert detect_launch(HYDRA) == LaunchInfo("mpich", 3, 4, 1, 2)
    # Hydra inside a Slurm allocation runs its proxies with srun: PMI wins over the step's vars
    assert detect_launch({**SRUN, **HYDRA}) == LaunchInfo("mpich", 3, 4, 1, 2)
    # srun --mpi=pmi2: PMI rank/size, the local rank from Slurm
    pmi_srun = {**SRUN, "PMI_RANK": "5", "PMI_SIZE": "8"}
    assert detect_launch(pmi_srun) == LaunchInfo("mpich", 5, 8, 1, 4)


def test_open_mpi_and_torchrun_precedence():
    assert detect_launch(OMPI) == LaunchInfo("mpirun", 2, 4, 0, 2)
    assert detect_launch({**BATCH, **OMPI}).launcher == "mpirun"  # mpirun in a batch script
    # torchrun started by srun / mpirun, one agent per node: its workers carry both
    for outer in (SRUN, OMPI, HYDRA):
        assert detect_launch({**outer, **TORCHRUN}) == LaunchInfo(
            "torchrun", 6, 16, 2, 8, "10.0.0.1", 29500
        )
    assert detect_launch({}) == LaunchInfo("single", 0, 1, 0, 1)


@pytest.mark.parametrize(
    "env,match",
    [
        ({**HYDRA, "PMI_RANK": "4"}, r"rank 4 is outside \[0, 4\) \(mpich\)"),
        ({**HYDRA, "PMI_SIZE": "four"}, "PMI_SIZE='four' is not an integer"),
        ({**SRUN, "SLURM_LOCALID": "4"}, r"local rank 4 is outside \[0, 4\) \(srun\)"),
        ({k: v for k, v in SRUN.items() if "NODELIST" not in k}, "set MASTER_ADDR and MASTER_PORT"),
        ({**SRUN, "SLURM_NODEID": "2"}, "SLURM_NODEID=2 but the step's tasks per node"),
    ],
)
def test_bad_variables_are_clear_errors(env, match):
    with pytest.raises(LaunchError, match=match):
        detect_launch(env)


def test_slurm_host_lists():
    assert slurm_first_host("gpu[07-09,12],cpu3") == "gpu07"
    assert slurm_first_host("node1,node2") == "node1"
    assert slurm_first_host("c[3,5]") == "c3"
    assert slurm_first_host("rack[2-3]-n[01-04]") == "rack2-n01"
    assert slurm_first_host("login") == "login"
    with pytest.raises(LaunchError, match="first host"):
        slurm_first_host("")
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("8") == [8]
    with pytest.raises(LaunchError, match="tasks per node"):
        expand_tasks_per_node("2x3")
    a = slurm_rendezvous({**SRUN, "SLURM_STEP_ID": "1"})
    assert a[0] == "gpu07" and a[1] != slurm_rendezvous(SRUN)[1]


_JOIN = """
import torch, torch.distributed as dist
from hetgmp.comm.launch import init_distributed, shutdown
env = init_distributed(device="cpu", timeout_s=60)
t = torch.tensor([env.rank + 1.0])
dist.all_reduce(t, group=env.group)
print("JOINED", env.launcher, env.rank, env.world_size, env.local_rank, int(t.item()), flush=True)
shutdown(env, wait_for_peers=True)
"""


def _clean_env() -> dict[str, str]:
    drop = ("OMPI_", "PMIX_", "PMI_", "SLURM_", "TORCHELASTIC_", "MASTER_", "RANK", "WORLD_SIZE")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def test_two_processes_meet_with_srun_variables():
    """A real 2-rank gloo job whose ranks know only what srun would tell them (no srun on
    this machine): the address comes from the step's node list (here 'localhost')."""
    from hetgmp.comm.launch import free_port

    base = {
        **_clean_env(),
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_NODEID": "0",
        "SLURM_STEP_NODELIST": "localhost",
        "MASTER_PORT": str(free_port()),
        "PYTHONPATH": str(ROOT),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _JOIN],
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for r, out in enumerate(outs):
        assert f"JOINED srun {r} 2 {r} 3" in out, out


def test_mpi4py_of_another_mpi_is_a_clear_error():
    """PMI variables (MPICH's mpiexec) while mpi4py is built against Open MPI: each process
    would be a world of its own and the address broadcast never meets the others."""
    code = """
from hetgmp.comm.launch import init_distributed
from hetgmp.comm.errors import LaunchError
try:
    init_distributed(device="cpu", timeout_s=10)
except LaunchError as err:
    print("ERR", err)
"""
    env = {**_clean_env(), "PMI_RANK": "1", "PMI_SIZE": "2", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, text=True, capture_output=True, timeout=120
    )
    assert "ERR the launcher (mpich) says rank 1 of 2, but mpi4py sees rank 0 of 1" in out.stdout, (
        out.stdout + out.stderr
    )
