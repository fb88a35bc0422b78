"""Dataset directory format: round trip, fingerprints, HET-GMP directories, atomic writes."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from hetgmp.data.format import DatasetError, DatasetWriter, make_fields, open_dataset


def test_round_trip(tiny_dataset):
    ds = open_dataset(tiny_dataset.root)
    assert ds.meta.num_embeddings == 70
    assert ds.train.sparse.shape == (400, 3) and ds.train.sparse.dtype == np.int32
    assert isinstance(ds.train.sparse, np.memmap)
    assert ds.test.dense.shape == (100, 2)
    assert ds.train.labels.shape == (400, 1)
    assert len(ds.fingerprint) == 64


def test_fingerprint_changes_with_content(tiny_dataset, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dataset.root, copy)
    arr = np.load(copy / "train_labels.npy")
    arr[0] = 1 - arr[0]
    np.save(copy / "train_labels.npy", arr)
    (copy / "meta.json").unlink()
    derived = open_dataset(copy)
    assert derived.derived
    assert derived.fingerprint != tiny_dataset.fingerprint


def test_hetgmp_directory_without_meta(tiny_dataset, tmp_path):
    copy = tmp_path / "het"
    shutil.copytree(tiny_dataset.root, copy)
    (copy / "meta.json").unlink()
    ds = open_dataset(copy)
    assert ds.fingerprint == tiny_dataset.fingerprint
    assert ds.meta.num_fields == 3 and ds.meta.num_dense == 2
    assert [f.offset for f in ds.meta.fields] == [0, 7, 57]


def test_failed_write_leaves_nothing(tmp_path):
    fields = make_fields(["a"], [3])
    with pytest.raises(DatasetError, match="outside its range"):
        with DatasetWriter(tmp_path / "out", fields, 0) as w:
            w.append("train", np.array([[5]]), None, np.array([1.0]))
    assert list(tmp_path.iterdir()) == []


def test_errors_name_the_file(tiny_dataset, tmp_path):
    copy = tmp_path / "bad"
    shutil.copytree(tiny_dataset.root, copy)
    (copy / "test_labels.npy").write_bytes(b"garbage")
    with pytest.raises(DatasetError, match="test_labels.npy"):
        _ = open_dataset(copy).test
    meta = json.loads((copy / "meta.json").read_text())
    meta["format"] = "other"
    (copy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="meta.json"):
        open_dataset(copy)
    with pytest.raises(DatasetError, match="does not exist"):
        open_dataset(tmp_path / "nope")
