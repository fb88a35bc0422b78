"""Who started this process: the launcher's environment variables, read in one place.

:func:`detect_launch` is a pure function of the environment (tests pass a dict). Launchers, in
the order they are checked (the first match wins; later ones may leave variables behind):

=========== ============================================ =========================================
launcher    variables                                    notes
=========== ============================================ =========================================
torchrun    ``TORCHELASTIC_RUN_ID``, ``RANK``,           first: a torchrun started by srun or
            ``WORLD_SIZE``, ``LOCAL_RANK``,              mpirun (one agent per node) leaves
            ``MASTER_ADDR`` / ``MASTER_PORT``            their variables in its workers
mpirun      ``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` /       Open MPI
            ``_LOCAL_RANK`` / ``_LOCAL_SIZE``
mpich       ``PMI_RANK``, ``PMI_SIZE``,                  MPICH and Intel MPI (Hydra's
            ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``     ``mpiexec`` / ``mpirun``)
torchrun    ``RANK``, ``WORLD_SIZE`` (+ ``MASTER_*``)    any other launcher that sets them
srun        ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``,  Slurm; a batch script's own shell has
            ``SLURM_LOCALID``, ``SLURM_NODEID``,         ``SLURM_PROCID`` / ``SLURM_NTASKS`` but
            ``SLURM_STEP_TASKS_PER_NODE``,               no ``SLURM_STEP_NUM_TASKS``: a plain
            ``SLURM_STEP_NODELIST``, ``SLURM_JOB_ID``    ``python`` there stays one process
single      none of the above                            one process
=========== ============================================ =========================================

Rendezvous (the TCP address every rank meets at): ``MASTER_ADDR`` / ``MASTER_PORT`` when set,
whatever the launcher. Otherwise: under srun the first host of the step's node list and a port
derived from the job and step ids (:func:`slurm_rendezvous`); under mpirun / mpich rank 0 picks
them and broadcasts them with mpi4py (see :func:`hetgmp.comm.launch.init_distributed`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping

from hetgmp.comm.errors import LaunchError

LAUNCHERS = ("mpirun", "mpich", "srun", "torchrun", "single")
SLURM_PORT_BASE = 15000
SLURM_PORT_SPAN = 20000


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """What the launcher told this process: who it is and where to meet the others."""

    launcher: str  # one of LAUNCHERS
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None = None
    master_port: int | None = None


def _int_var(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    if name not in environ:
        if default is None:
            raise LaunchError(f"environment variable {name} is not set")
        return default
    raw = environ[name]
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"environment variable {name}={raw!r} is not an integer") from None


def detect_launch(environ: Mapping[str, str] | None = None) -> LaunchInfo:
    """The launch this process belongs to (see the module docstring for the variables)."""
    env = os.environ if environ is None else environ
    addr = env.get("MASTER_ADDR")
    port = _int_var(env, "MASTER_PORT") if "MASTER_PORT" in env else None
    has_rank = "RANK" in env and "WORLD_SIZE" in env
    if has_rank and "TORCHELASTIC_RUN_ID" in env:
        info = _torchrun(env, addr, port)
    elif "OMPI_COMM_WORLD_RANK" in env:
        info = _from_vars(env, "mpirun", "OMPI_COMM_WORLD_", addr, port)
    elif "PMI_RANK" in env and "PMI_SIZE" in env:
        info = _mpich(env, addr, port)
    elif has_rank:
        info = _torchrun(env, addr, port)
    elif "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
        info = _srun(env, addr, port)
    else:
        info = LaunchInfo("single", 0, 1, 0, 1, addr, port)
    if not (0 <= info.rank < info.world_size):
        raise LaunchError(f"rank {info.rank} is outside [0, {info.world_size}) ({info.launcher})")
    if not (0 <= info.local_rank < info.local_world_size):
        raise LaunchError(
            f"local rank {info.local_rank} is outside [0, {info.local_world_size}) "
            f"({info.launcher})"
        )
    return info


def _from_vars(
    env: Mapping[str, str], launcher: str, prefix: str, addr: str | None, port: int | None
) -> LaunchInfo:
    rank = _int_var(env, prefix + "RANK")
    size = _int_var(env, prefix + "SIZE")
    local = _int_var(env, prefix + "LOCAL_RANK", 0)
    lsize = _int_var(env, prefix + "LOCAL_SIZE", size)
    return LaunchInfo(launcher, rank, size, local, lsize, addr, port)


def _mpich(env: Mapping[str, str], addr: str | None, port: int | None) -> LaunchInfo:
    rank = _int_var(env, "PMI_RANK")
    size = _int_var(env, "PMI_SIZE")
    # Hydra sets MPI_LOCALRANKID / MPI_LOCALNRANKS; under srun's PMI, Slurm's own variables
    local = _int_var(env, "MPI_LOCALRANKID", _int_var(env, "SLURM_LOCALID", 0))
    lsize = _int_var(env, "MPI_LOCALNRANKS", _slurm_local_size(env, size))
    return LaunchInfo("mpich", rank, size, local, lsize, addr, port)


def _torchrun(env: Mapping[str, str], addr: str | None, port: int | None) -> LaunchInfo:
    rank = _int_var(env, "RANK")
    size = _int_var(env, "WORLD_SIZE")
    local = _int_var(env, "LOCAL_RANK", rank)
    lsize = _int_var(env, "LOCAL_WORLD_SIZE", size)
    if addr is None or port is None:
        raise LaunchError("RANK/WORLD_SIZE are set but MASTER_ADDR/MASTER_PORT are not")
    return LaunchInfo("torchrun", rank, size, local, lsize, addr, port)


def _srun(env: Mapping[str, str], addr: str | None, port: int | None) -> LaunchInfo:
    rank = _int_var(env, "SLURM_PROCID")
    size = _int_var(env, "SLURM_STEP_NUM_TASKS")
    local = _int_var(env, "SLURM_LOCALID", 0)
    lsize = _slurm_local_size(env, size)
    if size > 1 and (addr is None or port is None):
        s_addr, s_port = slurm_rendezvous(env)
        addr = addr if addr is not None else s_addr
        port = port if port is not None else s_port
    return LaunchInfo("srun", rank, size, local, lsize, addr, port)


def _slurm_local_size(env: Mapping[str, str], default: int) -> int:
    """Tasks of this step on this node, from ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``)."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not spec or "SLURM_NODEID" not in env:
        return default
    per_node = expand_tasks_per_node(spec)
    node = _int_var(env, "SLURM_NODEID")
    if not 0 <= node < len(per_node):
        raise LaunchError(f"SLURM_NODEID={node} but the step's tasks per node are {spec!r}")
    return per_node[node]


def expand_tasks_per_node(spec: str) -> list[int]:
    """Slurm's tasks-per-node list, ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    out: list[int] = []
    for item in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if m is None:
            raise LaunchError(f"cannot read Slurm's tasks per node {spec!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def slurm_first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: ``"gpu[07-09,12],cpu3"`` -> ``"gpu07"``.

    Every bracket of the first entry contributes its first value (zero padding kept), so
    ``"rack[2-3]-n[01-04]"`` -> ``"rack2-n01"``.
    """
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            end = i
            break
    first = nodelist[:end].strip()
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], first)
    if not host or any(c in host for c in "[],"):
        raise LaunchError(f"cannot read the first host of Slurm's node list {nodelist!r}")
    return host


def slurm_rendezvous(env: Mapping[str, str]) -> tuple[str, int]:
    """(first host of the step, a port from the job and step ids) for an srun launch.

    The port is ``15000 + (16 * job id + step id) % 20000``: every rank computes the same one
    without talking to the others; two jobs landing on the same port on one host is possible
    (set ``MASTER_PORT`` then).
    """
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodelist or "SLURM_JOB_ID" not in env:
        raise LaunchError(
            "launched by srun but SLURM_STEP_NODELIST / SLURM_JOB_ID are not set; "
            "set MASTER_ADDR and MASTER_PORT (docs/multinode.md)"
        )
    step = _int_var(env, "SLURM_STEP_ID", 0) if env.get("SLURM_STEP_ID", "").isdigit() else 0
    job = _int_var(env, "SLURM_JOB_ID")
    return slurm_first_host(nodelist), SLURM_PORT_BASE + (16 * job + step) % SLURM_PORT_SPAN
