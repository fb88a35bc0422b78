"""The end-of-run summary for people (issue 32): aligned lines after the RESULT line, the data
set's best AUC where the generator recorded it, the numbers in the run's one format."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hetgmp.train.summary import summary_lines

ROOT = Path(__file__).resolve().parent.parent


def _hetgmp(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "hetgmp", *args], env=env, capture_output=True, text=True,
        timeout=55,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_train_prints_summary_after_result(tmp_path) -> None:
    data = tmp_path / "gen"
    _hetgmp("generate", "criteo-like", "--out", str(data), "--num-samples", "6000",
            "--scale", "0.0005")  # fmt: skip
    out = _hetgmp("train", "--dataset", str(data), "--iter", "10", "--batch-size", "128", "--warmup-steps", "2",
                  "--threads", "1", "--no-progress")  # fmt: skip
    lines = out.splitlines()
    result = json.loads(next(x for x in lines if x.startswith("RESULT ")).split(" ", 1)[1])
    start = lines.index("summary")
    body = lines[start + 1 :]
    names = [b.split()[0] for b in body]
    assert names[0] == "AUC" and "logloss" in names and "samples/s" in names and "wall" in names
    # aligned: every value starts in the same column
    col = 2 + len("bytes/sample") + 1
    assert all(b[col - 1] == " " and b[col] != " " for b in body), body
    best = json.loads((data / "meta.json").read_text())["best_auc"]
    assert f"best possible on this data set {best:.4f}" in body[0]
    # the same number as the EVAL line, in the same format
    eval_line = next(x for x in lines if x.startswith("EVAL "))
    auc = eval_line.split("val_auc ")[1].split()[0]
    assert body[0].split()[1] == auc == f"{result['val_auc']:.4f}"


def test_summary_leaves_out_what_the_run_lacks() -> None:
    lines = summary_lines({"speed": 123456.7}, best_auc=0.8, wall_s=2.5)
    assert lines == ["summary", "  samples/s 123457", "  wall time 2.5000 s"]


def test_a_run_within_its_warm_up_shows_that_pace_marked() -> None:
    lines = summary_lines({"speed": None, "warmup_speed": 48927.8}, best_auc=None, wall_s=1.5)
    assert lines[1] == "  samples/s 48927.8   (warm-up steps only)"
    steady = summary_lines({"speed": 5.0, "warmup_speed": 4.0}, best_auc=None, wall_s=1.5)
    assert steady[1] == "  samples/s 5.0000"
