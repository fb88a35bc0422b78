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


def test_one_flag_style_and_hetgmps_spellings() -> None:
    """The same concept has one name everywhere, with the other spellings as aliases:
    HET-GMP's partition flags, underscores or dashes, --iter/--iters, --timeout(-s),
    -n/--np/--ranks/--parts."""
    from hetgmp.cli import build_parser

    parser = build_parser()
    p = parser.parse_args(["partition", "--ngpus", "4", "--batch_size", "512", "--rerun", "2"])
    assert (p.nparts, p.batch_size, p.rounds) == (4, 512, 2)
    for flag in ("-n", "--nparts", "--parts", "--np", "--ranks"):
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
