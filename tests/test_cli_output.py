"""What the ``hetgmp`` command prints at its edges: ``--version``, and a reader that stops
early (``| head``) gets no traceback."""

from __future__ import annotations

import subprocess
import sys

from hetgmp import __version__


def test_version() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "hetgmp", "--version"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0 and p.stdout.strip() == f"hetgmp {__version__}", p.stdout + p.stderr


def test_closed_pipe_is_not_an_error(tiny_dataset, tmp_path) -> None:
    plan = tmp_path / "p.npz"
    made = subprocess.run(
        [sys.executable, "-m", "hetgmp", "partition", "-n", "2", "-o", str(plan), "--data",
         str(tiny_dataset.root), "--method", "hash", "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    # the reader has gone before the command writes a byte (as ``| head`` does, later)
    p = subprocess.Popen(
        [sys.executable, "-m", "hetgmp", "partition", "stats", str(plan), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0 and "Traceback" not in err, err
