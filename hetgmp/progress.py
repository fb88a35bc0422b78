"""When a progress bar is drawn, and how log lines get past one: the rule of every command.

A bar helps a person watching a terminal and is noise anywhere else. ``stderr.isatty()`` alone
is not enough: Open MPI gives every rank a pty even when ``mpirun ... > run.log`` sends the
job's output to a file, so the bar's frames (``\\r`` and all) leaked into the log, once per rank.
So under a launcher (mpirun, MPICH / Intel MPI, Slurm's srun, torchrun) bars are off unless
asked for (``--progress``); callers draw them on rank 0 only.

While a bar is on screen, a plain write lands on its line and the bar redraws over it:
:func:`log_above_bars` sends the ``logging`` module's console lines through ``tqdm.write``,
which clears the bar first.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import TextIO

# Variables a launcher sets in every process it starts (whatever its transport): Open MPI,
# MPICH / Intel MPI (PMI), PMIx, Slurm's srun (a step, not the batch shell), torchrun.
LAUNCHER_VARS = (
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PMIX_RANK",
    "SLURM_STEP_ID",
    "LOCAL_RANK",
    "TORCHELASTIC_RUN_ID",
)


def under_launcher(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started by a parallel launcher (see :data:`LAUNCHER_VARS`)."""
    env = os.environ if environ is None else environ
    return any(name in env for name in LAUNCHER_VARS)


def bar_wanted(
    enabled: bool | None,
    *,
    stream: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> bool:
    """Draw a bar on ``stream`` (default stderr)? ``False``: never; ``True``: forced (also
    under a launcher, for a person watching ``mpirun`` at a terminal); ``None``: when
    ``stream`` is a terminal and no launcher started this process."""
    if enabled is not None:
        return enabled
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not under_launcher(environ)


def auto_unless_off(progress: bool) -> bool | None:
    """A command's ``--progress`` that defaults to on means "when it helps" (``None``), and
    ``--no-progress`` means off."""
    return None if progress else False


@contextlib.contextmanager
def log_above_bars() -> Iterator[None]:
    """Within: ``logging`` lines to the console go through ``tqdm.write`` (above any bar)."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    with logging_redirect_tqdm():
        yield
