"""Numbers that overflow never become a silent inf, and a non-finite loss stops training
(issue 31, item 5).

Preprocessing refuses a value whose stored float32 would be inf (``1e400``, a 50-digit number,
a 400-digit Criteo integer) naming file, line and column, as it reports any bad line (``--on-
bad-line skip`` skips and counts it); training on a data set that holds an inf anyway (written
by other means) stops at the first step whose loss is not finite, names that step, writes no
checkpoint from it on and exits non-zero.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_ingest_criteo import criteo_lines, write

from hetgmp.cli import main
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.data.format import make_fields, write_dataset

HUGE_INT = "9" * 400


def test_criteo_overflowing_integer_is_refused_with_file_line_column(tmp_path) -> None:
    """The real command: a 400-digit integer (its chunk otherwise fits the typed fast path)."""
    lines = criteo_lines(50, seed=0)
    cols = lines[4].split("\t")
    cols[3] = HUGE_INT  # I3
    lines[4] = "\t".join(cols)
    raw = write(tmp_path / "day.tsv", lines)
    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "hetgmp", "preprocess", "criteo", str(raw), "--out", str(out),
           "--no-progress"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert f"{raw}:line 5: column I3: '{HUGE_INT}' is too large" in p.stderr
    assert "--on-bad-line skip" in p.stderr and not out.exists()
    p = subprocess.run([*cmd, "--on-bad-line", "skip"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["source"]["bad_lines"]["counts"] == {"bad_number": 1}
    assert sum(meta["splits"].values()) == 49


@pytest.mark.parametrize(
    "value,transform",
    [("1e400", "log"), ("1" * 50, "none"), ("-1e39", "none")],
)
def test_csv_overflowing_number_is_refused(tmp_path, capsys, value, transform) -> None:
    path = tmp_path / "x.csv"
    path.write_text(f"y,a,b\n1,2,c\n0,{value},d\n1,3,e\n")
    rc = main(["preprocess", "csv", str(path), "--label", "y", "--dense", "a",
               "--categorical", "b", "--header", "--dense-transform", transform,
               "--out", str(tmp_path / "o"), "--no-progress"])  # fmt: skip
    assert rc == 2
    assert f"{path}:line 3: column a: '{value}' is too large" in capsys.readouterr().err


def test_libsvm_overflowing_value_and_id_are_refused(tmp_path, capsys) -> None:
    for bad, what in (("1 0:1:1 1:0:1e400", "1:0:1e400"), (f"0 0:{HUGE_INT}:1 1:0:2", "0:9")):
        path = tmp_path / "d.libfm"
        path.write_text(f"1 0:1:1 1:0:0.5\n{bad}\n")
        rc = main(["preprocess", "libsvm", str(path), "--dense-fields", "1",
                   "--out", str(tmp_path / "o"), "--no-progress"])  # fmt: skip
        assert rc == 2
        err = capsys.readouterr().err
        assert f"{path}:line 2: token '{what}" in err and "a number is too large" in err


def test_parquet_infinite_value_is_refused(tmp_path, capsys) -> None:
    path = tmp_path / "x.parquet"
    table = pa.table({"y": [1, 0, 1], "x": [0.5, 1e300, 2.0], "c": ["a", "b", "c"]})
    pq.write_table(table, path)
    rc = main(["preprocess", "parquet", str(path), "--label", "y", "--dense", "x",
               "--categorical", "c", "--out", str(tmp_path / "o"), "--no-progress"])  # fmt: skip
    assert rc == 2
    assert f"{path}:row 2: column x: 1e+300 is too large" in capsys.readouterr().err


def _inf_dataset(root, bad_row: int):
    """400 training samples; sample ``bad_row`` has inf dense features (written directly)."""
    rng = np.random.default_rng(0)
    cards = [7, 50, 13]
    fields = make_fields(["a", "b", "c"], cards)
    offs = np.array([f.offset for f in fields])

    def split(n: int):
        local = np.stack([rng.integers(0, c, n) for c in cards], axis=1)
        return local + offs, rng.random((n, 2), dtype=np.float32), (rng.random(n) < 0.5)

    train, test = split(400), split(100)
    train[1][bad_row] = np.inf
    return write_dataset(root, fields, {"train": train, "test": test}, num_dense=2)


def _train_cmd(ds, tmp_path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hetgmp", "train", "--dataset", str(ds.root),
            "--batch-size", "64", "--embed-dim", "4", "--no-shuffle", "--no-val",
            "--no-progress", "--threads", "1", "--iter", "6", *extra]  # fmt: skip


def test_training_stops_at_the_first_nonfinite_loss(tmp_path) -> None:
    """Sample 150 is in step 3 (batches of 64, no shuffle): the run stops naming step 3, from
    the TRAIN line (every 2 steps: the check waits for it) or before a checkpoint (every step:
    none is written for step 3 or later), and exits non-zero."""
    ds = _inf_dataset(tmp_path / "inf", bad_row=150)
    p = subprocess.run(_train_cmd(ds, tmp_path, "--log-every", "2"),
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert "hetgmp train: error: the loss is nan at step 3 (rank 0's batch)" in p.stderr
    ck = tmp_path / "ck"
    cmd = _train_cmd(ds, tmp_path, "--log-every", "100", "--checkpoint-dir", str(ck),
                     "--checkpoint-every", "1")  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "at step 3 (rank 0's batch)" in p.stderr
    assert sorted(d.name for d in ck.glob("step-*")) == ["step-00000001", "step-00000002"]


def _train_rank(env, cfg) -> dict:
    from hetgmp.train.run import train

    return train(cfg, env)


def test_every_rank_stops_naming_the_same_step(tmp_path) -> None:
    """Two gloo ranks, the inf sample in one rank's part: both stop naming the same step."""
    from test_train import _cfg

    ds = _inf_dataset(tmp_path / "inf", bad_row=390)
    cfg = _cfg(ds.root, iter=6, shuffle=False, val=False, threads=1, log_every=100)
    outcomes = spawn_ranks(_train_rank, 2, cfg, timeout_s=120, raise_on_error=False)
    errors = [o.message for o in outcomes]
    assert [o.error_type for o in outcomes] == ["DivergedError"] * 2, errors
    assert all("the loss is nan at step" in e for e in errors), errors
    assert len({e.split("(rank")[0] for e in errors}) == 1  # the same step on both
