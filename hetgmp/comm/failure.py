"""One error message per failed job: the first rank to fail says why, the others stay quiet.

Why: under ``mpirun`` (or torchrun, srun) every rank usually fails the same way (bad data, a
peer's bad input), and each printed the same error, interleaved with Open MPI's banners: about
30 lines at 4 ranks for one cause (issue 32). The ranks of one job on one host share a parent
process (``prted``, torchrun's agent, ``slurmstepd``) and a temporary directory, so the first to
create a marker file named after the job is the one that reports; there is no collective to
agree through, since a failing job's collectives are what broke.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from hetgmp.comm.errors import PeerFailedError

# Launcher variables naming the job, so two jobs under one parent get different markers.
JOB_VARS = (
    "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_hnp_uri",
    "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "PMI_ID",
)  # fmt: skip
# A rank that failed because a peer reported a failure lets that peer report first.
PEER_GRACE_S = 1.0


# Markers older than this are an earlier job's (a failing job's ranks claim within seconds):
# any claim removes them, so /tmp does not collect one file per failed job.
STALE_S = 24 * 3600


def _started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, Linux), or "" where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def job_key(environ: Mapping[str, str] | None = None, parent: int | None = None) -> str:
    """A name shared by the ranks of this job on this host (the job's variables and the
    launcher process that started them, with its start time: a pid is reused, and a marker of
    an earlier job under the same pid silenced every rank of a later one)."""
    env = os.environ if environ is None else environ
    ppid = os.getppid() if parent is None else parent
    parts = [env.get(v, "") for v in JOB_VARS] + [str(ppid), _started(ppid)]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))[:200]


def marker_path(key: str, directory: Path | None = None) -> Path:
    return Path(directory or tempfile.gettempdir()) / f"hetgmp-failed-{key}"


def claim_first_failure(
    err: BaseException, *, key: str | None = None, directory: Path | None = None
) -> bool:
    """True for the first rank of the job (on this host) to fail: that rank reports the error.

    Atomic (``O_CREAT | O_EXCL``); a rank whose error is only that a peer failed waits
    :data:`PEER_GRACE_S` first, so the message is the cause, not its echo."""
    if isinstance(err, PeerFailedError):
        time.sleep(PEER_GRACE_S)
    path = marker_path(job_key() if key is None else key, directory)
    _remove_stale(path.parent)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError:
        return True  # (no writable temporary directory: better every rank than none)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    return True


def reports_error(err: BaseException) -> bool:
    """Whether this process prints ``err``: always when alone, else only the first failing rank
    of a launched job (:func:`claim_first_failure`)."""
    from hetgmp.comm.detect import detect_launch

    try:
        alone = detect_launch().world_size <= 1
    except RuntimeError:  # (the launcher's variables are unusable: say so everywhere)
        alone = True
    return alone or claim_first_failure(err)


def _remove_stale(directory: Path) -> None:
    """Remove failure markers older than :data:`STALE_S` (earlier jobs')."""
    now = time.time()
    with contextlib.suppress(OSError):
        for p in directory.glob("hetgmp-failed-*"):
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > STALE_S:
                    p.unlink()
