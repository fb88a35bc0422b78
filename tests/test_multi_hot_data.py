"""Multi-hot fields in the dataset directory (issue 34, data layer): the ragged layout, its
version, dataset info / verify, the generator's --multi-hot, and the refusals of train and
partition. Real files, the real CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from hetgmp.cli import main as cli_main
from hetgmp.data.format import DatasetError, FieldInfo, make_fields, open_dataset, write_dataset
from hetgmp.data.generate import build_model, generate_criteo_like, sample_users
from hetgmp.data.generate_config import CriteoLikeConfig
from hetgmp.data.id_ranges import check_id_ranges
from hetgmp.data.multi_hot import NOT_TRAINED_YET, multi_hot_paths
from hetgmp.data.planted_multi_hot import build_multi_hot, multi_hot_bags
from hetgmp.metrics import roc_auc

FIELDS = make_fields(["a", "b"], [3, 4])
HIST = [FieldInfo("hist", 10, 7)]
SPARSE = np.array([[0, 3], [1, 4], [2, 6]])
LABELS = np.array([0.0, 1.0, 0.0])
SMALL = dict(num_samples=6000, scale=0.002, progress=False, log=lambda line: None)


def _write(root: Path) -> None:
    """Train: lists [7, 8], [], [9, 16, 7] (an empty list and a repeat); test: [10]."""
    bags = [(np.array([7, 8, 9, 16, 7]), np.array([0, 2, 2, 5]))]
    test = (SPARSE[:1], None, LABELS[:1], [(np.array([10]), np.array([0, 1]))])
    write_dataset(root, FIELDS, {"train": (SPARSE, None, LABELS, bags), "test": test},
                  multi_hot=HIST)  # fmt: skip


def test_ragged_layout_round_trips_and_is_version_2(tmp_path: Path) -> None:
    _write(tmp_path / "mh")
    ds = open_dataset(tmp_path / "mh")
    assert ds.meta.version == 2 and [f.name for f in ds.meta.multi_hot] == ["hist"]
    assert ds.meta.num_embeddings == 17  # 3 + 4 single-hot rows, then 10 multi-hot rows
    got = ds.train.multi_hot[0]
    assert got.values.tolist() == [7, 8, 9, 16, 7] and got.offsets.tolist() == [0, 2, 2, 5]
    assert got.lengths().tolist() == [2, 0, 3]
    assert ds.test.multi_hot[0].values.tolist() == [10]
    stats = ds.meta.multi_hot_stats["train"][0]
    assert (stats["values"], stats["min_length"], stats["max_length"]) == (5, 0, 3)
    assert (stats["min_id"], stats["max_id"]) == (7, 16)


def test_single_hot_directory_stays_version_1(tmp_path: Path) -> None:
    write_dataset(tmp_path / "plain", FIELDS, {"train": (SPARSE, None, LABELS)})
    d = json.loads((tmp_path / "plain" / "meta.json").read_text())
    assert d["version"] == 1 and "multi_hot" not in d
    assert open_dataset(tmp_path / "plain").train.multi_hot == []


def test_writer_refuses_bad_lists(tmp_path: Path) -> None:
    bad_id = [(np.array([7, 17]), np.array([0, 1, 2, 2]))]  # 17 is past hist's [7, 17)
    with pytest.raises(DatasetError, match="id 17 is outside its range"):
        write_dataset(tmp_path / "x", FIELDS, {"train": (SPARSE, None, LABELS, bad_id)},
                      multi_hot=HIST)  # fmt: skip
    short = [(np.array([7]), np.array([0, 1]))]  # offsets for 1 sample, chunk has 3
    with pytest.raises(DatasetError, match="offsets has shape"):
        write_dataset(tmp_path / "y", FIELDS, {"train": (SPARSE, None, LABELS, short)},
                      multi_hot=HIST)  # fmt: skip
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_info_and_verify_report_multi_hot(tmp_path: Path, capsys) -> None:
    _write(tmp_path / "mh")
    assert cli_main(["dataset", "info", str(tmp_path / "mh")]) == 0
    out = capsys.readouterr().out
    assert "1 multi-hot" in out and "5 ids, length 0..3 (mean 1.67), ids 7..16" in out
    assert cli_main(["dataset", "verify", str(tmp_path / "mh")]) == 0
    out = capsys.readouterr().out
    assert "multi-hot field hist, 3 samples, 5 ids" in out and "offsets monotone" in out


def _corrupt(root: Path, kind: str, pos: int, value: int) -> None:
    path = multi_hot_paths(root, "train", 0)[kind]
    arr = np.load(path, mmap_mode="r+")
    arr[pos] = value
    arr.flush()


@pytest.mark.parametrize(
    ("kind", "pos", "value", "says"),
    [
        ("offsets", 1, 3, "offsets decrease at sample 1"),
        ("values", 3, 30, "1 ids of multi-hot field hist outside [7, 17); first at value 3"),
        ("offsets", 3, 4, "runs 0..4, expected 0..5"),
    ],
)
def test_verify_names_the_broken_file(tmp_path: Path, capsys, kind, pos, value, says) -> None:
    _write(tmp_path / "mh")
    _corrupt(tmp_path / "mh", kind, pos, value)
    assert cli_main(["dataset", "verify", str(tmp_path / "mh")]) == 1
    out = capsys.readouterr().out
    assert says in out and "fingerprint mismatch" in out


def test_train_refuses_multi_hot_partition_accepts_it(tmp_path: Path, capsys) -> None:
    _write(tmp_path / "mh")
    data = str(tmp_path / "mh")
    # (CPU trains them: tests/test_train_multi_hot.py and _dist.py; the rest is refused, and
    # so is any caller of check_id_ranges that cannot read bags)
    rc = cli_main(["train", "--dataset", data, "--cache-dir", str(tmp_path / "c"), "--no-val",
                   "--device", "cuda"])  # fmt: skip
    assert rc != 0
    err = capsys.readouterr().err
    assert ("issue 34" in err and "hist" in err) or "CUDA" in err
    with pytest.raises(ValueError, match=re.escape(NOT_TRAINED_YET)):
        check_id_ranges(open_dataset(data), open_dataset(data).meta.num_embeddings)
    # the partitioner reads the lists (tests/test_partition_multi_hot.py)
    rc = cli_main(["partition", "--data", data, "-n", "2", "-o", str(tmp_path / "p.npz")])
    assert rc == 0 and (tmp_path / "p.npz").exists()


def test_generator_multi_hot_cli(tmp_path: Path, capsys) -> None:
    out = tmp_path / "g"
    rc = cli_main(["generate", "criteo-like", "--out", str(out), "--num-samples", "6000",
                   "--scale", "0.002", "--multi-hot", "2:6", "--no-progress"])  # fmt: skip
    assert rc == 0
    ds = open_dataset(out)
    assert [f.name for f in ds.meta.multi_hot] == ["M1", "M2"]
    assert ds.meta.multi_hot[0].offset == sum(f.cardinality for f in ds.meta.fields)
    lengths = ds.train.multi_hot[1].lengths()
    assert lengths.min() >= 1 and lengths.max() <= 11 and abs(lengths.mean() - 6) < 0.2
    # best_auc is the AUC of the stored true probabilities, which include the lists' term.
    probs = np.load(out / "test_true_probs.npy")
    assert ds.meta.best_auc == pytest.approx(roc_auc(ds.test.labels.ravel(), probs))
    assert cli_main(["dataset", "verify", str(out)]) == 0
    assert cli_main(["generate", "criteo-like", "--out", str(tmp_path / "x"),
                     "--multi-hot", "2"]) == 2  # fmt: skip
    assert "multi_hot" in capsys.readouterr().err.replace("-", "_")


def test_generator_without_multi_hot_is_unchanged(tmp_path: Path) -> None:
    plain = generate_criteo_like(tmp_path / "p", seed=5, **SMALL)
    multi = generate_criteo_like(tmp_path / "m", seed=5, multi_hot="1:4", **SMALL)
    assert plain.meta.version == 1 and not plain.meta.multi_hot
    # The single-hot ids are the same draws; the lists change the labels' probabilities.
    assert np.array_equal(plain.train.sparse, multi.train.sparse)
    assert not np.array_equal(
        np.load(tmp_path / "p" / "test_true_probs.npy"),
        np.load(tmp_path / "m" / "test_true_probs.npy"),
    )


def _user_reuse(locality: float) -> float:
    """Share of list entries whose id the same user already had in an earlier list."""
    cfg = CriteoLikeConfig(num_samples=20_000, scale=0.01, locality=locality, multi_hot="1:8")
    m = build_model(cfg, 18_000)
    mm = build_multi_hot(cfg.multi_hot, cfg.scale, locality, cfg.seed, 18_000, 0)
    users = sample_users(m, 0, 20_000).astype(np.uint64)
    bags, _ = multi_hot_bags(mm, 0, 20_000, users)
    values, offsets = bags[0]
    owner = np.repeat(users, np.diff(offsets))
    pairs = owner * np.uint64(1 << 32) + values.astype(np.uint64)
    _, first = np.unique(pairs, return_index=True)
    return 1.0 - first.size / pairs.size


def test_lists_come_from_the_users_interests() -> None:
    # With locality, a user's lists keep returning to their 16 interests.
    assert _user_reuse(0.8) > _user_reuse(0.0) + 0.2  # (0.87 vs 0.58 measured)
