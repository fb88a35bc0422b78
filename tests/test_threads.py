"""``--threads 0`` (issue 32 item 3): each rank's share of the cores the load leaves free, at
least one, and the log says what was picked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetgmp.cli import main
from hetgmp.train import threads


@pytest.mark.parametrize(
    ("cores", "load", "ranks", "want"),
    [
        (2, 2.7, 1, 1),  # the shared 2-core box: two threads collapsed there (bench)
        (2, 0.0, 1, 2),  # the same box idle
        (8, 0.0, 1, 8),
        (8, 4.0, 2, 2),  # 4 cores free, shared by 2 ranks
        (8, 0.0, 16, 1),  # more ranks than cores: still one each
        (4, 9.0, 1, 1),
    ],
)
def test_default_threads_leave_busy_cores_alone(monkeypatch, cores, load, ranks, want) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load, load, load))
    n, why = threads.default_threads(ranks)
    assert n == want and f"load average {load:.1f}" in why


def test_the_log_says_what_was_picked(tiny_dataset, monkeypatch, capsys) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    args = ["train", "--dataset", str(tiny_dataset.root), "--iter", "1", "--batch-size", "16",
            "--device", "cpu", "--no-progress", "--no-val"]  # fmt: skip
    assert main([*args, "--threads", "2"]) == 0
    assert "threads: 2 torch intra-op thread(s) per rank (--threads)" in capsys.readouterr().out
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "threads: 1 torch intra-op thread(s) per rank (--threads 0: 2 cores" in out, out
    assert "reader thread (--prefetch-batches 4)" in out


_PINNED = """
import os, sys
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
from hetgmp.train import threads
threads.os.getloadavg = lambda: (0.0, 0.0, 0.0)  # an idle box: only the affinity may limit
print(threads.default_threads(1)[0])
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                    reason="needs CPU affinity and two cores")  # fmt: skip
def test_default_threads_stay_within_the_cores_the_process_may_use() -> None:
    # a rank pinned to one core (mpirun --bind-to core, taskset, a Slurm cgroup) got the
    # machine's core count from os.cpu_count and ran 2+ threads on its one core
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", _PINNED], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(root)}, timeout=50, check=True)  # fmt: skip
    assert out.stdout.strip() == "1", out
