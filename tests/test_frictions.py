"""Issue 32 item 8, the small frictions, each with the check that failed before its fix."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hetgmp.choices import PADDED_NEEDS
from hetgmp.partition.plan import Plan, PlanError

ROOT = Path(__file__).resolve().parent.parent


def _hetgmp(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "hetgmp", *args], env=env, capture_output=True, text=True,
        timeout=55,
    )  # fmt: skip


def test_readme_help_and_error_agree_on_padded() -> None:
    readme = re.sub(r"\s+", " ", (ROOT / "README.md").read_text().replace("`", ""))
    assert f"it needs {PADDED_NEEDS}" in readme
    help_text = re.sub(r"\s+", " ", _hetgmp("train", "--help").stdout)
    assert PADDED_NEEDS in help_text
    p = _hetgmp("train", "--exchange", "padded", "--replies", "stale", "--iter", "1")
    assert p.returncode == 2 and f"--exchange padded needs {PADDED_NEEDS}" in p.stderr, p.stderr
    p = _hetgmp("train", "--exchange", "padded", "--sync", "async", "--iter", "1")
    assert p.returncode == 2 and "--sync async" in p.stderr, p.stderr


def test_dataset_info_says_a_split_file_is_missing(tiny_dataset, tmp_path) -> None:
    ds = tmp_path / "ds"
    shutil.copytree(tiny_dataset.root, ds)
    assert _hetgmp("dataset", "info", str(ds)).returncode == 0
    (ds / "test_labels.npy").unlink()
    p = _hetgmp("dataset", "info", str(ds))
    assert p.returncode == 1
    assert "MISSING      test_labels.npy" in p.stdout
    assert "missing test_labels.npy" in p.stderr


def test_plan_worker_count_grammar() -> None:
    plan = Plan(
        data_partition=np.zeros(4, np.int32),
        embed_partition=np.array([0, 1, 2, 3], np.int32),
        mirrors=[np.zeros(0, np.int64)] * 4,
    )
    with pytest.raises(PlanError, match="made for 4 workers but 1 is running"):
        plan.check_matches(world_size=1)
    with pytest.raises(PlanError, match="made for 4 workers but 2 are running"):
        plan.check_matches(world_size=2)


def test_resume_fingerprint_mismatch_names_both_data_sets(tiny_dataset, tmp_path) -> None:
    a, b, ck = tmp_path / "day1", tmp_path / "day2", tmp_path / "ck"
    shutil.copytree(tiny_dataset.root, a)
    common = ["--iter", "2", "--batch-size", "16", "--no-val", "--no-progress", "--threads", "1"]
    p = _hetgmp("train", "--dataset", str(a), "--checkpoint-dir", str(ck),
                "--checkpoint-every", "2", *common)  # fmt: skip
    assert p.returncode == 0, p.stderr
    shutil.copytree(a, b)
    meta = json.loads((b / "meta.json").read_text())
    meta["fingerprint"] = "f" * 64  # (another day's data: same shape, other content)
    (b / "meta.json").write_text(json.dumps(meta))
    p = _hetgmp("train", "--dataset", str(b), "--checkpoint-dir", str(ck), "--resume", *common)
    assert p.returncode == 2
    assert f"made for another data set: {a} (fingerprint " in p.stderr, p.stderr
    assert f"this run's data set {b} has fingerprint ffffffffffff..." in p.stderr, p.stderr


def test_an_unknown_dataset_name_says_how_to_make_one(tmp_path) -> None:
    """``--dataset criteo`` (HET-GMP names its data sets) where nothing of that name is
    prepared: the error names the place looked in and the commands that make a data set."""
    from hetgmp.comm.env import DistEnv
    from hetgmp.config import validate
    from hetgmp.data.format import DatasetError
    from hetgmp.train.config import TrainConfig
    from hetgmp.train.run import resolve_dataset
    from hetgmp.train.runlog import RunLog

    cfg = validate(TrainConfig(dataset="criteo", cache_dir=tmp_path, progress=False))
    with pytest.raises(DatasetError, match=r"under .*datasets \(make one with `hetgmp preprocess`"):
        resolve_dataset(cfg, DistEnv.single(), RunLog(active=False))
