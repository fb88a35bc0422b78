"""What the ``hetgmp`` command prints at its edges: ``--version``, a reader that stops early
(``| head``) gets no traceback, progress bars only for a person at a terminal (and log lines
above them), key=value pairs instead of dict reprs."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import re
import select
import struct
import subprocess
import sys
import termios
from typing import TextIO

from hetgmp import __version__
from hetgmp.fmt import key_values
from hetgmp.progress import LAUNCHER_VARS
from hetgmp.train.runlog import RunLog


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


def test_one_flag_style_and_hetgmps_spellings() -> None:
    """The same concept has one name everywhere, with the other spellings as aliases:
    HET-GMP's partition flags, underscores or dashes, --iter/--iters, --timeout(-s),
    -n/--np/--ranks/--parts."""
    from hetgmp.cli import build_parser

    parser = build_parser()
    # (HET-GMP's partition.py: --nrank/-n parts, --ngpus/-g GPUs per node, -b, -r)
    p = parser.parse_args(["partition", "--nrank", "4", "--ngpus", "2", "--batch_size", "512",
                           "--rerun", "2"])  # fmt: skip
    assert (p.nparts, p.gpus_per_node, p.batch_size, p.rounds) == (4, 2, 512, 2)
    p = parser.parse_args(["partition", "-n", "16", "-g", "8", "-b", "1024", "-r", "3"])
    assert (p.nparts, p.gpus_per_node, p.batch_size, p.rounds) == (16, 8, 1024, 3)
    for flag in ("-n", "--nparts", "--parts", "--np", "--ranks", "--nrank"):
        assert parser.parse_args(["partition", flag, "3"]).nparts == 3
    t = parser.parse_args(["train", "--iters", "7", "--timeout", "9", "--batch_size", "16"])
    assert (t.iter, t.timeout_s, t.batch_size) == (7, 9.0, 16)
    e = parser.parse_args(["experiment", "store-rate", "--data", "d", "--out", "o", "--np", "2",
                           "--iter", "5", "--timeout", "60", "--batch_size", "32"])  # fmt: skip
    assert (e.ranks, e.iters, e.timeout_s, e.batch_size) == (2, 5, 60.0, 32)


def test_csv_file_after_a_column_list(tmp_path) -> None:
    """``preprocess csv --categorical a b clicks.csv``: the file after the list is an input,
    not a column (argparse's nargs took it); the same data as with the file first."""
    csv = tmp_path / "clicks.csv"
    rows = ["click,price,user,item"] + [f"{i % 2},{i * 0.5},u{i % 7},i{i % 5}" for i in range(60)]
    csv.write_text("\n".join(rows) + "\n")
    outs = []
    for order in ("after", "before"):
        out = tmp_path / order
        cols = ["--label", "click", "--dense", "price", "--categorical", "user", "item"]
        args = [*cols, str(csv)] if order == "after" else [str(csv), *cols]
        p = subprocess.run(
            [sys.executable, "-m", "hetgmp", "preprocess", "csv", *args, "--out", str(out),
             "--no-progress"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        outs.append((out / "train_sparse_feats.npy").read_bytes())
    assert outs[0] == outs[1]


def _pty(monkeypatch) -> tuple[int, TextIO]:  # noqa: ANN001
    """A real terminal (a pty, 80 columns) as this process's stderr; its reading end."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    term = open(slave, "w", buffering=1)  # noqa: SIM115 (closed by the test's teardown)
    monkeypatch.setattr(sys, "stderr", term)
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    return master, term


def test_bar_only_for_a_person_at_a_terminal(monkeypatch) -> None:
    """Open MPI gives each rank a pty even when ``mpirun ... > log`` writes to a file: under a
    launcher the bar is off unless --progress forces it; rank 0 only; never off a terminal."""
    _, term = _pty(monkeypatch)
    assert RunLog(active=True, progress=None, stream=term).progress
    assert not RunLog(active=False, progress=None, stream=term).progress  # (not rank 0)
    assert not RunLog(active=True, progress=False, stream=term).progress
    for var in ("OMPI_COMM_WORLD_SIZE", "LOCAL_RANK", "PMI_SIZE", "SLURM_STEP_ID"):
        monkeypatch.setenv(var, "2")
        assert not RunLog(active=True, progress=None, stream=term).progress, var
        assert RunLog(active=True, progress=True, stream=term).progress  # --progress
        monkeypatch.delenv(var)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # redirected: no bar
    assert not RunLog(active=True, progress=None, stream=term).progress


def test_log_lines_go_above_the_bar(monkeypatch) -> None:
    """On a terminal, a log line (ours or the logging module's) clears the bar first instead of
    landing on its line."""
    master, term = _pty(monkeypatch)
    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger().addHandler(handler)
    try:
        log = RunLog(active=True, progress=None, stream=term)
        log.start_bar(10)
        log.advance(3)
        logging.getLogger("hetgmp.test").warning("hello")
        log.info("world")
        log.close()
    finally:
        logging.getLogger().removeHandler(handler)
    term.flush()
    out = ""
    while select.select([master], [], [], 0.5)[0]:  # (a pty hands its output out in pieces)
        out += os.read(master, 1 << 16).decode()
    assert "step/s]" in out  # (a bar was drawn)
    for line in ("hello", "world"):
        assert f"\r{line}\r\n" in out and f"]{line}" not in out, out


def test_output_lines_are_key_value_pairs(tiny_dataset, tmp_path) -> None:
    """No Python dict reprs in what the commands print; preprocess's second pass counts rows
    and says rows (it printed them as bytes=)."""
    csv = tmp_path / "clicks.csv"
    csv.write_text("click,user\n" + "".join(f"{i % 2},u{i % 7}\n" for i in range(50)))
    p = subprocess.run(
        [sys.executable, "-m", "hetgmp", "preprocess", "csv", str(csv), "--label", "click",
         "--categorical", "user", "--out", str(tmp_path / "d"), "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert re.search(r"splits test=5 train=45,", p.stdout), p.stdout
    (pass2,) = [ln for ln in p.stderr.splitlines() if "pass 2/2" in ln]
    assert "rows=50" in pass2 and "bytes=" not in pass2
    p = subprocess.run(
        [sys.executable, "-m", "hetgmp", "partition", "-n", "2", "-o", str(tmp_path / "p.npz"),
         "--data", str(tiny_dataset.root), "--method", "metis", "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    (metis,) = [ln for ln in p.stderr.splitlines() if "graph_edges" in ln]  # METIS's facts
    assert metis.startswith("partition metis ") and "unplaced_over_balance.rows=" in metis
    assert "{" not in p.stdout + p.stderr


def test_key_values() -> None:
    assert (
        key_values({"a": 1, "b": {"c": 0.5, "d": "x y"}, "e": ""}) == "a=1 b.c=0.5 b.d='x y' e=''"
    )
