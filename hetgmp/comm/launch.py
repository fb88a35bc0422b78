"""Process-group setup for ``mpirun`` (Open MPI, MPICH, Intel MPI), ``srun``, ``torchrun`` or a
single plain process.

The launcher's environment variables are read in exactly one place,
:func:`hetgmp.comm.detect.detect_launch`, which returns a small frozen :class:`LaunchInfo`;
everything else takes that value.

Start-up: every wait (MPI_Init, rank 0's address, the rendezvous store, the process group) is
bounded by ``timeout_s`` and names the ranks that did not arrive (:mod:`hetgmp.comm.startup`).

Failure behaviour: the process group is created with ``timeout_s``. When a rank dies, its peers'
next collective fails either at once (gloo sees the TCP connection close) or, if the peer hangs
without closing its sockets, after ``timeout_s`` seconds; torch raises a ``RuntimeError`` /
``DistBackendError`` that :mod:`hetgmp.comm.exchange` re-raises as :class:`CommError` naming the
rank and the collective. No rank waits forever.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
import types
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hetgmp.comm.collectives import group_barrier
from hetgmp.comm.detect import LAUNCHERS, LaunchInfo, detect_launch
from hetgmp.comm.env import DistEnv
from hetgmp.comm.errors import LaunchError
from hetgmp.comm.failure import claim_first_failure
from hetgmp.comm.startup import arrival_marks, arrive, wait_for, watched

ADDRESS_BYTES = 256  # rank 0's "addr:port" as sent over MPI
ADDRESS_TAG = 7091
ABORT_WAIT_S = 10.0  # a rank that did not report waits this long for the reporter's abort

__all__ = ["LAUNCHERS", "LaunchInfo", "detect_launch", "init_distributed", "shutdown"]


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def my_address() -> str:
    """An address of this host the other ranks can reach (the one used for outbound traffic)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent; picks the outbound interface
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def pick_device(device: str, local_rank: int, local_world_size: int) -> torch.device:
    """``auto``: one GPU per rank (``local_rank % device_count``) when there are at least as many
    GPUs as ranks on this host, else CPU (more ranks than GPUs runs on CPU, see DESIGN.md)."""
    if device == "auto":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n > 0 and local_world_size <= n:
            return torch.device("cuda", local_rank % n)
        return torch.device("cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise LaunchError("device 'cuda' requested but CUDA is not available")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if device == "cpu":
        return torch.device("cpu")
    raise LaunchError(f"device must be auto, cpu or cuda, got {device!r}")


def connect(
    *,
    rank: int,
    world_size: int,
    addr: str,
    port: int,
    backend: str = "auto",
    device: torch.device,
    launcher: str,
    local_rank: int = 0,
    timeout_s: float = 120.0,
) -> DistEnv:
    """Join a TCP rendezvous at ``addr:port`` and return this rank's :class:`DistEnv`."""
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend not in ("gloo", "nccl"):
        raise LaunchError(f"backend must be auto, gloo or nccl, got {backend!r}")
    if backend == "nccl" and device.type != "cuda":
        raise LaunchError("backend 'nccl' needs CUDA devices; use gloo on CPU")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    store = _store(addr, port, rank, world_size, timeout)
    arrive(store, rank, world_size, timeout_s)  # (names the ranks that do not come)
    try:
        dist.init_process_group(
            backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
    except (RuntimeError, ValueError) as err:
        raise LaunchError(
            f"rank {rank}/{world_size}: could not join the rendezvous at {addr}:{port} "
            f"within {timeout_s:.0f}s ({err})"
        ) from err
    return DistEnv(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=device,
        backend=backend,
        launcher=launcher,
        group=dist.group.WORLD,
    )


def _store(
    addr: str, port: int, rank: int, world_size: int, timeout: datetime.timedelta
) -> dist.TCPStore:
    """The rendezvous store at ``addr:port``: rank 0 hosts it, without waiting for the others
    (:func:`~hetgmp.comm.startup.arrive` does, naming the missing), unless torchrun's agent
    hosts it already (``TORCHELASTIC_USE_AGENT_STORE``: every rank a client)."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    try:
        return dist.TCPStore(
            addr, port, world_size, is_master=rank == 0 and not agent, timeout=timeout,
            wait_for_workers=False,
        )  # fmt: skip
    except (RuntimeError, ValueError) as err:
        host = "torchrun's agent" if agent else "rank 0"
        raise LaunchError(
            f"rank {rank}/{world_size}: start-up: could not reach the rendezvous store at "
            f"{addr}:{port} (hosted by {host}) within {timeout.total_seconds():g}s ({err}); "
            f"{host} did not arrive, or the address is wrong"
        ) from err


def init_distributed(
    *, backend: str = "auto", device: str = "auto", timeout_s: float = 120.0
) -> DistEnv:
    """Detect how we were launched and set up the process group.

    * single process: no process group, ``DistEnv`` with ``group=None``;
    * torchrun: ``MASTER_ADDR``/``MASTER_PORT`` from the environment;
    * srun: the first host of the step and a port from the job id (see
      :func:`hetgmp.comm.detect.slurm_rendezvous`), unless ``MASTER_ADDR``/``MASTER_PORT`` are set;
    * mpirun (Open MPI, MPICH, Intel MPI): rank 0 picks its address and a free port and
      broadcasts them with mpi4py (unless ``MASTER_ADDR``/``MASTER_PORT`` are set).

    gloo on CPU, NCCL on CUDA (``backend="auto"``). ``timeout_s`` bounds every collective.
    """
    info = detect_launch()
    dev = pick_device(device, info.local_rank, info.local_world_size)
    if info.world_size == 1:
        env = DistEnv.single(dev)
        env.launcher = info.launcher
        return env
    addr, port = info.master_addr, info.master_port
    if addr is None or port is None:
        addr, port = _mpi_rendezvous(info, timeout_s)
    return connect(
        rank=info.rank,
        world_size=info.world_size,
        addr=addr,
        port=int(port),
        backend=backend,
        device=dev,
        launcher=info.launcher,
        local_rank=info.local_rank,
        timeout_s=timeout_s,
    )


def _mpi_rendezvous(info: LaunchInfo, timeout_s: float) -> tuple[str, int]:
    """Rank 0's address and a free port, sent with mpi4py (mpirun / mpich launches); every
    wait bounded by ``timeout_s`` (:mod:`hetgmp.comm.startup`)."""
    marks = arrival_marks(os.environ)
    world = info.world_size if info.local_world_size == info.world_size else 0  # (one host)
    try:  # (MPI_Init waits for every rank with the interpreter's lock held: a watchdog process)
        with watched(timeout_s, "MPI_Init (mpi4py, every rank meets there)", info.rank, marks,
                     world):  # fmt: skip
            from mpi4py import MPI
    except ImportError as err:
        raise LaunchError(
            f"launched by {info.launcher} but mpi4py is not importable ({err}); install it, "
            "or set MASTER_ADDR and MASTER_PORT (docs/multinode.md)"
        ) from err
    comm = MPI.COMM_WORLD
    if (comm.Get_rank(), comm.Get_size()) != (info.rank, info.world_size):
        # e.g. mpi4py built against Open MPI in a job started by MPICH's mpiexec: each
        # process is then a world of its own and the broadcast would never meet the others
        raise LaunchError(
            f"the launcher ({info.launcher}) says rank {info.rank} of {info.world_size}, but "
            f"mpi4py sees rank {comm.Get_rank()} of {comm.Get_size()}: mpi4py is built against "
            "another MPI than the one that started the job; set MASTER_ADDR and MASTER_PORT "
            "(docs/multinode.md) or install mpi4py against this MPI"
        )
    deadline = time.monotonic() + timeout_s
    buf = np.zeros(ADDRESS_BYTES, dtype=np.uint8)  # ("addr:port", no pickle)
    if info.rank == 0:
        text = f"{my_address()}:{free_port()}".encode()
        buf[: len(text)] = np.frombuffer(text, dtype=np.uint8)
        reqs = [comm.Isend(buf, dest=r, tag=ADDRESS_TAG) for r in range(1, info.world_size)]
        if not wait_for(lambda: MPI.Request.Testall(reqs), deadline):
            late = [r + 1 for r, q in enumerate(reqs) if not q.Test()]
            raise _late(info, late, timeout_s, "did not take rank 0's address")
    else:
        req = comm.Irecv(buf, source=0, tag=ADDRESS_TAG)
        if not wait_for(req.Test, deadline):
            raise _late(info, [0], timeout_s, "did not send its address")
    addr, _, port = bytes(buf).rstrip(b"\0").decode().rpartition(":")
    return addr, int(port)


def _late(info: LaunchInfo, ranks: list[int], timeout_s: float, what: str) -> LaunchError:
    return LaunchError(
        f"rank {info.rank}: start-up: rank(s) {', '.join(map(str, ranks))} {what} within "
        f"{timeout_s:g}s (--timeout-s); stopped, hung, or never started"
    )


def _drop_captured_references(pg: Any) -> int:
    """Replace ``pg`` with ``None`` wherever an imported ``torch.distributed.*`` module holds it
    as a function default argument; returns how many defaults were replaced.

    Some torch modules bind ``group.WORLD`` into default arguments *when they are imported*
    (``torch.distributed.nn.functional``: ten functions; fsdp's ``ShardedGradScaler``,
    ``ZeroRedundancyOptimizer``). Imported before the process group exists they bind ``None``;
    imported after it (``torch.optim`` pulls them in lazily through ``torch._dynamo`` when the
    first optimizer is built) they keep the process group alive after
    ``destroy_process_group``. ``None`` is what an import before ``init_process_group`` binds.
    """
    dropped = 0

    def scrub(fn: Any) -> None:
        nonlocal dropped
        # type(), never isinstance()/getattr(): some module attributes warn or import on access
        if type(fn) in (staticmethod, classmethod):
            fn = fn.__func__
        if type(fn) is not types.FunctionType:
            return
        if fn.__defaults__ and any(d is pg for d in fn.__defaults__):
            dropped += sum(d is pg for d in fn.__defaults__)
            fn.__defaults__ = tuple(None if d is pg else d for d in fn.__defaults__)
        if fn.__kwdefaults__ and any(d is pg for d in fn.__kwdefaults__.values()):
            dropped += sum(d is pg for d in fn.__kwdefaults__.values())
            fn.__kwdefaults__ = {k: None if d is pg else d for k, d in fn.__kwdefaults__.items()}

    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith("torch.distributed."):
            continue
        for obj in list(vars(mod).values()):
            if issubclass(type(obj), type) and vars(obj).get("__module__") == name:
                for attr in list(vars(obj).values()):
                    scrub(attr)
            else:
                scrub(obj)
    return dropped


def shutdown(env: DistEnv, *, wait_for_peers: bool = False) -> None:
    """Tear the process group down (no-op for a single process).

    ``wait_for_peers`` (after a successful run) first meets every rank at a barrier, so no rank
    closes its connections while a peer is still finishing its last collective — an early close
    can abort the peer inside gloo. After a failure there is no barrier: peers may be gone.

    The process group must really be freed here, not at interpreter exit: gloo's worker threads
    (``pt_gloo_runloop``) are joined only by the group's destructor (``destroy_process_group``
    and ``shutdown()`` leave them running). A worker still alive when Python finalizes can take
    the GIL to drop a tensor of its last work item; Python ends such a thread with
    ``pthread_exit`` inside a ``noexcept`` C++ frame, which is ``std::terminate`` -> SIGABRT:
    "terminate called without an active exception", exit 134, with the worker's stack ending in
    ``ProcessGroupGloo::runLoop`` -> ``TensorImpl::decref_pyobject`` -> ``PyEval_AcquireThread``.
    So besides our own reference, the references torch modules imported after the group was
    created keep (see :func:`_drop_captured_references`) are dropped before we return.
    """
    while env.closers:  # (before any group goes: see DistEnv.closers)
        env.closers.pop()()
    if env.group is not None and dist.is_initialized():
        if wait_for_peers:
            group_barrier(env)
        pg = env.group
        env.group = None
        env.groups.clear()  # (destroyed with the default group just below)
        dist.destroy_process_group()
        _drop_captured_references(pg)
        del pg  # the last reference: the destructor joins gloo's worker threads now


def abort_job(env: DistEnv, err: BaseException) -> None:
    """After a failure on this rank under ``mpirun``: say why, then end the whole job.

    Why: Open MPI's ``mpirun`` waits for every process, so one peer that hangs (stopped, or
    blocked in a collective that can never complete) kept the job alive forever after this rank
    had reported its timeout. ``MPI_Abort`` makes ``mpirun`` kill every rank. (torchrun's agent
    already ends the other workers when one fails; MPICH / Intel MPI's Hydra ends the job when
    a process exits with an error; srun does with ``--kill-on-bad-exit=1``, see
    docs/multinode.md; one process has no peers.)"""
    if env.launcher != "mpirun" or env.world_size <= 1:
        return
    from mpi4py import MPI

    if claim_first_failure(err):
        print(
            f"hetgmp: error on rank {env.rank} of {env.world_size} (the first to fail; ending "
            f"the mpirun job with MPI_Abort): {err}",
            file=sys.stderr,
            flush=True,
        )
    else:  # another rank reported and aborts: one message, one Open MPI banner
        time.sleep(ABORT_WAIT_S)  # (mpirun kills us meanwhile; if it did not, end it ourselves)
    MPI.COMM_WORLD.Abort(2)
