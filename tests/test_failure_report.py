"""A failed job says why once (issue 32): the first rank to fail prints the error, the others
stay quiet, and under ``mpirun`` one ``MPI_Abort`` banner follows instead of one per rank."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpirun_job import mpirun_env

from hetgmp.comm.failure import claim_first_failure, job_key


def _claim(directory: str, key: str, out: multiprocessing.Queue) -> None:
    out.put(claim_first_failure(ValueError("bad"), key=key, directory=Path(directory)))


def test_exactly_one_of_racing_processes_reports(tmp_path) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(str(tmp_path), "job1", out)) for _ in range(4)]
    for p in procs:
        p.start()
    claims = [out.get(timeout=50) for _ in procs]
    for p in procs:
        p.join(timeout=50)
    assert sorted(claims) == [False, False, False, True]
    # another job (another key) reports again
    assert claim_first_failure(ValueError("x"), key="job2", directory=tmp_path)


def test_a_reused_launcher_pid_is_another_job(tmp_path) -> None:
    # an earlier job's marker under the same launcher pid (pids are reused) made every rank of
    # a later job believe another had reported: the failure printed nothing at all
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        key = job_key({"TORCHELASTIC_RUN_ID": "none"}, parent=sleeper.pid)
        assert claim_first_failure(ValueError("day 1"), key=key, directory=tmp_path)
    finally:
        sleeper.kill()
        sleeper.wait()
    # the pid no longer names the process that launched the first job (as when reused)
    later = job_key({"TORCHELASTIC_RUN_ID": "none"}, parent=sleeper.pid)
    assert claim_first_failure(ValueError("day 2"), key=later, directory=tmp_path)


def test_markers_of_old_jobs_are_removed(tmp_path) -> None:
    old = tmp_path / "hetgmp-failed-old-job"
    old.write_text("1\n")
    os.utime(old, (1e9, 1e9))  # 2001: an earlier job's
    assert claim_first_failure(ValueError("x"), key="new-job", directory=tmp_path)
    assert not old.exists() and (tmp_path / "hetgmp-failed-new-job").exists()


def test_job_key_separates_jobs() -> None:
    a = job_key({"PMIX_NAMESPACE": "prterun-vm-1@1"}, parent=10)
    assert a == job_key({"PMIX_NAMESPACE": "prterun-vm-1@1"}, parent=10)
    assert a != job_key({"PMIX_NAMESPACE": "prterun-vm-2@1"}, parent=10)
    assert a != job_key({"PMIX_NAMESPACE": "prterun-vm-1@1"}, parent=11)
    assert "/" not in job_key({"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:5/x"}, parent=1)


@pytest.mark.mpi
def test_mpirun_error_printed_once(tmp_path) -> None:
    mpirun, env = mpirun_env()
    empty = tmp_path / "empty"
    empty.mkdir()
    cmd = [
        mpirun, "-np", "3", "--oversubscribe", sys.executable, "-m", "hetgmp", "train",
        "--dataset", str(empty), "--iter", "2", "--device", "cpu", "--no-progress",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=55)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    # every rank fails on the missing data set; one says so, and one Open MPI banner follows
    assert out.count("is this a dataset directory?") == 1, out
    assert "(the first to fail; ending the mpirun job with MPI_Abort)" in out, out
    assert out.count("MPI_ABORT was invoked") == 1, out


def test_cli_unknown_flag_suggests(capsys) -> None:
    from hetgmp.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--dataset", "x", "--bach-size", "3"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --bach-size (did you mean --batch-size?) 3" in err
    with pytest.raises(SystemExit):
        main(["experiment", "staleness", "--data", "x", "--out", "y", "--bonds=1"])
    assert "--bonds=1 (did you mean --bounds?)" in capsys.readouterr().err
