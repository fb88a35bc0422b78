"""Start-up waits bounded by the job's timeout (``--timeout-s``), each ending with an error that
names the rank(s) that did not arrive.

A rank that is stopped, hung or never started must not hold its peers at start-up forever.
The waits, in order (:func:`hetgmp.comm.launch.init_distributed`):

1. **MPI_Init** (mpi4py's import, under mpirun / mpiexec): every rank waits there for all the
   others, inside the MPI library with the interpreter's lock held, so no Python thread can
   end it. A :class:`Watchdog` *process* does: unless start-up cancels it within the timeout
   it prints the error and kills this rank (SIGKILL), and the launcher then ends the job.
   Which ranks are missing MPI cannot say; each rank leaves a mark in a directory of the
   job's own on this host (:func:`arrival_marks`), so on one host the watchdog names them.
2. **Rank 0's address** (sent over MPI, :func:`hetgmp.comm.launch.mpi_rendezvous`): waited
   for by polling a non-blocking receive up to the deadline.
3. **The rendezvous store** (:func:`arrive`): rank 0 hosts a TCP store (or torchrun's agent
   does), every rank writes its arrival, and rank 0 waits until all have, naming the missing
   ones after the timeout (and telling the others, who raise the same error); a rank that
   cannot reach rank 0's store names rank 0.
4. **The process group** (gloo / NCCL) is then set up with every rank known present, bounded
   by the same timeout; the RPC services' handshake (``--sync async``) goes through it.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hetgmp.comm.errors import LaunchError

POLL_S = 0.05
TELL_S = 5.0  # how long rank 0 waits for the ranks present to read which ones are missing
# How long past its own deadline a rank waits for rank 0's verdict before blaming rank 0: rank
# 0's deadline starts when it hosts the store, a peer's a moment later, and on a busy machine
# rank 0 can be descheduled past the peer's deadline; without it, the peer named rank 0
# ("did not confirm") instead of the rank that never came.
VERDICT_GRACE_S = 2.0
KEY = "hetgmp/start/"  # the rendezvous store's keys of the start-up (arrivals, verdict)

# The watchdog: waits on its stdin (closed by cancel(), or by this rank's death) up to the
# timeout; then prints the error (with the ranks that left no mark) and kills the rank.
_DOG = r"""
import os, select, signal, sys
pid, timeout, msg, marks, world = int(sys.argv[1]), float(sys.argv[2]), *sys.argv[3:6]
if select.select([sys.stdin], [], [], timeout)[0]:
    sys.exit(0)
try:
    here = {int(n) for n in os.listdir(marks) if n.isdigit()} if marks and int(world) else None
except OSError:
    here = None
if here is not None:
    missing = [r for r in range(int(world)) if r not in here]
    msg += f"; rank(s) {', '.join(map(str, missing))} did not arrive" if missing else (
        "; every rank of this host arrived")
else:
    msg += "; which rank did not arrive MPI cannot say (the ranks run on several hosts)"
sys.stderr.write(msg + " (stopped, hung or still starting); ending this rank\n")
sys.stderr.flush()
os.kill(pid, signal.SIGKILL)
"""


class Watchdog:
    """A child process that kills this one with ``message`` on stderr unless :meth:`cancel`
    comes within ``timeout_s`` (for waits inside C code that holds the interpreter's lock).
    ``marks`` / ``world``: a directory of arrival marks and the ranks expected in it (0: do
    not name ranks)."""

    def __init__(self, timeout_s: float, message: str, marks: Path | None, world: int) -> None:
        argv = [str(os.getpid()), f"{timeout_s}", message, str(marks or ""), str(world)]
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _DOG, *argv], stdin=subprocess.PIPE
        )

    def cancel(self) -> None:
        """The wait is over: the child exits without a word."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def arrival_marks(environ: dict[str, str] | os._Environ[str]) -> Path | None:
    """A directory on this host that only this job's ranks use (named by the launcher's job id:
    Open MPI's PMIx namespace, MPICH's KVS name), or None if the launcher gives no id."""
    for var in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "PMI_KVSNAME"):
        job = environ.get(var)
        if job:
            return Path(tempfile.gettempdir()) / ("hetgmp-start-" + re.sub(r"[^\w.-]", "_", job))
    return None


@contextlib.contextmanager
def watched(
    timeout_s: float, what: str, rank: int, marks: Path | None, world: int
) -> Iterator[None]:
    """Run the block under a :class:`Watchdog` (see the module docstring, step 1), with this
    rank's arrival mark in ``marks`` while it runs (``world``: ranks expected there)."""
    mark = None
    if marks is not None:
        with contextlib.suppress(OSError):
            marks.mkdir(exist_ok=True)
            mark = marks / str(rank)
            mark.touch()
    msg = (f"hetgmp rank {rank}: error: start-up: {what} did not complete within "
           f"{timeout_s:g}s (--timeout-s)")  # fmt: skip
    dog = Watchdog(timeout_s, msg, marks if mark is not None else None, world)
    try:
        yield
    finally:
        dog.cancel()
        if mark is not None and marks is not None:
            with contextlib.suppress(OSError):
                mark.unlink()
                marks.rmdir()  # (the last rank's succeeds)


def wait_for(test: Any, deadline: float) -> bool:
    """Poll ``test()`` until it is true (True) or ``deadline`` (``time.monotonic``) passes."""
    while not test():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def arrive(store: Any, rank: int, world: int, timeout_s: float) -> None:
    """(Every rank) write this rank's arrival to the rendezvous ``store`` and wait for all
    ranks' (see the module docstring, step 3): a :class:`LaunchError` naming the ranks that
    did not arrive within ``timeout_s``, on every rank that did."""
    deadline = time.monotonic() + timeout_s
    try:
        store.set(f"{KEY}{rank}", "1")
        if rank == 0:
            missing = list(range(world))

            def all_here() -> bool:
                missing[:] = [r for r in missing if not store.check([f"{KEY}{r}"])]
                return not missing

            if not wait_for(all_here, deadline):
                store.set(f"{KEY}missing", ",".join(map(str, missing)))
                # (the store goes with this process: the ranks present read the verdict first)
                told = [f"{KEY}told/{r}" for r in range(1, world) if r not in missing]
                wait_for(lambda: store.check(told), time.monotonic() + TELL_S)
                raise _missing(rank, missing, timeout_s)
            store.set(f"{KEY}go", "1")
            return
        if not wait_for(lambda: store.check([f"{KEY}go"]) or store.check([f"{KEY}missing"]),
                        deadline + VERDICT_GRACE_S):  # fmt: skip
            raise _missing(rank, [0], timeout_s, "did not confirm the others' arrival")
        if not store.check([f"{KEY}go"]):
            store.set(f"{KEY}told/{rank}", "1")
            raise _missing(rank, [int(r) for r in store.get(f"{KEY}missing").decode().split(",")],
                           timeout_s)  # fmt: skip
    except LaunchError:
        raise
    except RuntimeError as err:  # (the store's own timeout: rank 0, its host, is not there)
        raise _missing(rank, [0], timeout_s, f"hosts the rendezvous store and did not answer "
                       f"({err})") from err  # fmt: skip


def _missing(rank: int, ranks: list[int], timeout_s: float, why: str = "") -> LaunchError:
    who = ", ".join(map(str, ranks))
    return LaunchError(
        f"rank {rank}: start-up: rank(s) {who} did not arrive at the rendezvous within "
        f"{timeout_s:g}s (--timeout-s){': ' + why if why else ''}; stopped, hung, or never "
        "started"
    )
