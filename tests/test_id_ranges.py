"""Ids outside their field are refused when training opens the data, naming file and column
(issue 31, item 6): writers record each column's id range in meta.json; older directories
(no ranges) are scanned instead and still train."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from hetgmp.cli import main
from hetgmp.data.format import DatasetWriter, make_fields, open_dataset
from hetgmp.data.id_ranges import check_id_ranges


def _write(root, bad: int | None = None):
    """400 / 100 samples of 3 fields (cards 7, 50, 13); with ``bad``, train sample 5's column
    1 holds the global id ``bad`` (written unchecked, as an encoder with a bug would)."""
    rng = np.random.default_rng(0)
    cards = [7, 50, 13]
    fields = make_fields(["a", "b", "c"], cards)
    offs = np.array([f.offset for f in fields])
    w = DatasetWriter(root, fields, num_dense=0)
    for split, n in (("train", 400), ("test", 100)):
        ids = np.stack([rng.integers(0, c, n) for c in cards], axis=1) + offs
        if split == "train" and bad is not None:
            ids[5, 1] = bad
        w.append(split, ids, None, (rng.random(n) < 0.5).astype(np.float32), check_ids=False)
    return w.close()


def _train(root) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "hetgmp", "train", "--dataset", str(root), "--iter", "2",
           "--batch-size", "64", "--embed-dim", "4", "--no-val", "--no-progress",
           "--threads", "1"]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_recorded_ranges_match_the_arrays_and_are_kept(tmp_path) -> None:
    ds = _write(tmp_path / "ok")
    rec = json.loads((ds.root / "meta.json").read_text())["id_ranges"]
    for split in ("train", "test"):
        sparse = np.asarray(ds.split(split).sparse)
        assert rec[split]["min"] == sparse.min(axis=0).tolist()
        assert rec[split]["max"] == sparse.max(axis=0).tolist()
    assert check_id_ranges(ds, ds.meta.num_embeddings) == []  # nothing scanned


def test_training_refuses_an_out_of_range_id_at_open(tmp_path) -> None:
    """The real command stops before training, naming the file and the column, from the
    recorded range, and from a scan for a directory written before ranges were recorded."""
    ds = _write(tmp_path / "bad", bad=7 + 50)  # field b is [7, 57): 57 is field c's first id
    p = _train(ds.root)
    assert p.returncode == 2, p.stderr
    want = f"{ds.root / 'train_sparse_feats.npy'}: column 1 (field 'b') holds ids"
    assert want in p.stderr and "..57 (recorded in meta.json" in p.stderr
    assert "outside the field's [7, 57)" in p.stderr and "TRAIN" not in p.stdout
    meta = json.loads((ds.root / "meta.json").read_text())
    del meta["id_ranges"]  # as an older hetgmp wrote it
    (ds.root / "meta.json").write_text(json.dumps(meta))
    p = _train(ds.root)
    assert p.returncode == 2 and want in p.stderr and "..57 (scanned)" in p.stderr
    # `hetgmp partition` refuses it too, before building its graph
    rc = main(["partition", "-n", "2", "-o", str(tmp_path / "p.npz"), "--data", str(ds.root)])
    assert rc == 2


def test_a_directory_without_recorded_ranges_still_trains(tmp_path) -> None:
    ds = _write(tmp_path / "old")
    meta = json.loads((ds.root / "meta.json").read_text())
    del meta["id_ranges"]
    (ds.root / "meta.json").write_text(json.dumps(meta))
    assert check_id_ranges(open_dataset(ds.root), ds.meta.num_embeddings) == ["train", "test"]
    p = _train(ds.root)
    assert p.returncode == 0, p.stderr
    assert "meta.json records no id ranges for train/test: scanned them" in p.stdout + p.stderr
