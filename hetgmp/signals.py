"""SIGTERM handled like Ctrl-C, and the hidden temp directories an interrupted run leaves.

Slurm, ``timeout``, Kubernetes and mpirun stop a job with SIGTERM, whose default action ends the
process at once: no ``finally``, no ``except BaseException`` cleanup, so a half-written
``.NAME.tmp-*`` stayed behind. :func:`terminate_as_interrupt` (installed once by the CLI entry,
``hetgmp.cli.main``) turns the first SIGTERM into :class:`Terminated`, a ``KeyboardInterrupt``,
so every stage unwinds through the cleanup paths Ctrl-C already takes. A second SIGTERM takes
the default action (the sender insists; cleanup hanging must not keep the job alive).

:func:`remove_stale_temps` removes what a run killed harder (SIGKILL, a power cut) left.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process receives SIGTERM."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process
    raise Terminated(f"received {signal.Signals(signum).name}")


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (the previous
    handler is restored afterwards). Outside the main thread nothing is installed: Python only
    runs signal handlers there."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def temp_name(out: Path) -> Path:
    """A fresh hidden temp path beside ``out``: ``.NAME.tmp-PID-RANDOM`` (the pid lets a later
    run tell a dead writer's leftovers from a live one's)."""
    return out.parent / f".{out.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temps(out: Path) -> list[Path]:
    """Remove ``.NAME.tmp-*`` beside ``out`` left by writers that are no longer running (those
    named by an older scheme without a pid too); returns what was removed."""
    out = Path(out)
    if not out.parent.is_dir():
        return []
    pattern = re.compile(re.escape(f".{out.name}.tmp-") + r"(?:(\d+)-)?[0-9a-f]+$")
    removed = []
    for p in out.parent.iterdir():
        m = pattern.match(p.name)
        if m is None or (m.group(1) is not None and _alive(int(m.group(1)))):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed
