"""Run a function on N freshly spawned CPU ranks joined by a real gloo process group (for tests).

``spawn_ranks(fn, world_size, *args)`` starts ``world_size`` processes (``forkserver`` start
method: forked from a server that imported torch once; the caller's environment and working
directory), each calls ``fn(env, *args)`` with its :class:`DistEnv` and sends back the return
value (which must be picklable). Unlike ``torch.multiprocessing.spawn`` a failing rank does NOT kill its peers:
each rank's outcome (result, exception, or death) is reported, so tests can check that the other
ranks failed cleanly by themselves. The whole run has a wall-clock deadline; ranks still running
then are killed and reported as hung.

``fn`` must be importable by the children: define it at module level.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import multiprocessing.reduction
import os
import pickle
import queue as queue_mod
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from hetgmp.comm.launch import connect, free_port, shutdown

# What the forkserver imports once for every rank (read when it starts: the parent's first
# spawn). torch._dynamo too: the first torch optimizer a rank builds imports it (~1.1 s a
# rank, more than a small test's training). So a forked rank has triton imported (dynamo
# imports it) and torch.distributed.nn & co. imported before its process group, unlike a
# launched job: ranks that need either otherwise use ``start_method="spawn"``
# (tests/test_comm_teardown.py, the interpreter runs of tests/test_whole_step_multi.py).
PRELOAD: tuple[str, ...] = ("torch", "numpy", "torch._dynamo")


@dataclasses.dataclass
class RankOutcome:
    """What one spawned rank did: ``status`` is ``ok``, ``error``, ``died`` or ``hung``."""

    rank: int
    status: str
    result: Any = None
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    seconds: float = 0.0  # wall time from process start to outcome

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class SpawnError(RuntimeError):
    """At least one spawned rank failed; the message holds every failed rank's traceback."""

    def __init__(self, outcomes: list[RankOutcome]) -> None:
        self.outcomes = outcomes
        parts = []
        for o in outcomes:
            if not o.ok:
                parts.append(
                    f"--- rank {o.rank}: {o.status} {o.error_type}: {o.message}\n{o.traceback}"
                )
        super().__init__("spawned ranks failed:\n" + "\n".join(parts))


class _CallerFd:
    """The caller's descriptor ``fd`` (1, 2) as it is when a rank starts, duplicated into the
    rank at pickling time: a forkserver child would otherwise write where the server's
    descriptors pointed when it started (an earlier test's capture, a terminal long gone)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return (_adopt_fd, (self.fd, multiprocessing.reduction.DupFd(self.fd)))


def _adopt_fd(fd: int, dup: Any) -> int:
    """(In the rank) point ``fd`` at the caller's descriptor."""
    inherited = dup.detach()
    os.dup2(inherited, fd)
    os.close(inherited)
    return fd


def _exit_text(exitcode: int) -> str:
    """``exit code 3`` / ``killed by SIGABRT (exit code -6)`` (the rank's stderr has the rest)."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name} (exit code {exitcode}); see its stderr"
    return f"exited with code {exitcode}"


def _child(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    args_blob: bytes,
    q: Any,
    collective_timeout_s: float,
    threads: int,
    environ: dict[str, str],
    cwd: str,
    fds: list[int],  # (1 and 2, now the caller's: unpickling _CallerFd pointed them)
) -> None:
    t0 = time.monotonic()
    # (the server's environment is the one it started with: the caller's may have changed)
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    torch.set_num_threads(threads)  # N ranks share a few cores; avoid oversubscription
    env = None
    try:
        env = connect(
            rank=rank,
            world_size=world_size,
            addr="127.0.0.1",
            port=port,
            backend="gloo",
            device=torch.device("cpu"),
            launcher="spawn",
            local_rank=rank,
            timeout_s=collective_timeout_s,
        )
        result = fn(env, *pickle.loads(args_blob))
        q.put(pickle.dumps(RankOutcome(rank, "ok", result=result, seconds=time.monotonic() - t0)))
    except BaseException as err:  # noqa: BLE001 - reported to the parent, not swallowed
        q.put(
            pickle.dumps(
                RankOutcome(
                    rank,
                    "error",
                    error_type=type(err).__name__,
                    message=str(err),
                    traceback=traceback.format_exc(),
                    seconds=time.monotonic() - t0,
                )
            )
        )
    finally:
        if env is not None:
            try:
                shutdown(env)
            except Exception:  # noqa: BLE001 - peers may be gone already; nothing to clean
                pass


def spawn_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 120.0,
    collective_timeout_s: float = 60.0,
    threads: int = 1,
    raise_on_error: bool = True,
    start_method: str = "forkserver",
) -> list[RankOutcome] | list[Any]:
    """Run ``fn(env, *args)`` on ``world_size`` spawned gloo ranks.

    Returns the per-rank results (rank order) when every rank succeeded, else raises
    :class:`SpawnError`; with ``raise_on_error=False`` returns the list of :class:`RankOutcome`
    instead. ``collective_timeout_s`` is the process-group timeout inside the ranks.
    ``start_method="spawn"`` starts each rank as a fresh interpreter, nothing of
    :data:`PRELOAD` imported: for a rank that must set its environment before torch imports
    triton (``TRITON_INTERPRET``), or import torch's modules after its process group.
    """
    if start_method not in ("forkserver", "spawn"):
        raise ValueError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
    ctx = mp.get_context("spawn") if start_method == "spawn" else mp.get_context("forkserver")
    if start_method == "forkserver":
        # One server per parent process imports these once; each rank is forked from it
        # instead of a fresh interpreter importing torch (~1.5 s a rank).
        ctx.set_forkserver_preload(list(PRELOAD))
    where = (dict(os.environ), os.getcwd(), [_CallerFd(1), _CallerFd(2)])
    # Plain pickle (bytes) both ways: torch's multiprocessing pickler would share tensors through
    # file descriptors that die with the child process.
    args_blob = pickle.dumps(args)
    q = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_child,
            args=(fn, r, world_size, port, args_blob, q, collective_timeout_s, threads, *where),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    outcomes = _collect(procs, q, timeout_s)
    _reap(procs, outcomes, timeout_s)
    q.close()
    result = [outcomes[r] for r in range(world_size)]
    if not raise_on_error:
        return result
    if not all(o.ok for o in result):
        raise SpawnError(result)
    return [o.result for o in result]


def _collect(procs: list[Any], q: Any, timeout_s: float) -> dict[int, RankOutcome]:
    """Outcomes that arrive (or ranks that die) before the deadline ``timeout_s`` from now."""
    world_size = len(procs)
    outcomes: dict[int, RankOutcome] = {}
    deadline = time.monotonic() + timeout_s
    # Drain the queue while waiting: a child blocks on exit until its queued result is read.
    while len(outcomes) < world_size and time.monotonic() < deadline:
        try:
            o = pickle.loads(q.get(timeout=0.2))
            outcomes[o.rank] = o
            continue
        except queue_mod.Empty:
            pass
        for r, p in enumerate(procs):
            if r not in outcomes and not p.is_alive() and p.exitcode is not None:
                # Give the feeder a moment: a result may still be in flight.
                try:
                    o = pickle.loads(q.get(timeout=1.0))
                    outcomes[o.rank] = o
                except queue_mod.Empty:
                    outcomes[r] = RankOutcome(r, "died", message=_exit_text(p.exitcode))
    return outcomes


def _reap(procs: list[Any], outcomes: dict[int, RankOutcome], timeout_s: float) -> None:
    """Kill the ranks still running (hung), join all, and mark ranks that died after returning."""
    for r, p in enumerate(procs):
        if r not in outcomes:
            outcomes[r] = RankOutcome(
                r, "hung", message=f"still running after {timeout_s:.0f}s; killed"
            )
            p.kill()
        p.join(timeout=10)
        o = outcomes[r]
        if o.ok and p.exitcode not in (0, None):
            # The result arrived, but the process died on its way out (process-group teardown,
            # interpreter exit): a real launcher would report this rank as failed, so do we.
            outcomes[r] = dataclasses.replace(
                o, status="died", message=f"returned its result, then {_exit_text(p.exitcode)}"
            )
