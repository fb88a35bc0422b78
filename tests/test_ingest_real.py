"""Ingestion of the real samples in ../shared/datasets (read in place; skipped when absent)."""

from __future__ import annotations

import csv

import numpy as np

from hetgmp.cli import main
from hetgmp.data.criteo_sample import convert_criteo_sample, encode_criteo_sample_hetgmp_reference
from hetgmp.data.format import open_dataset
from hetgmp.data.movielens import FIELDS, convert_movielens
from hetgmp.data.preprocess import PreprocessOptions


def _criteo_rows(root, name):
    with open(root / "criteo-sample" / name, newline="") as f:
        return list(csv.reader(f, delimiter="\t"))


def test_criteo_sample_splits_and_labels(shared_datasets, tmp_path):
    ds = convert_criteo_sample(shared_datasets / "criteo-sample", tmp_path / "cs",
                               options=PreprocessOptions(progress=False, min_count=2))
    rows = {n: _criteo_rows(shared_datasets, n) for n in ("train.csv", "dev.csv", "test.csv")}
    assert [len(r) for r in rows.values()] == [7200, 409, 391]
    assert ds.meta.splits == {"train": 7200, "test": 800}
    labels = [float(r[0]) for r in rows["train.csv"]]
    np.testing.assert_array_equal(ds.train.labels.ravel(), labels)
    assert ds.meta.stats["positive_rate"] == 1728 / 8000
    # min_count=2: values seen once over all 8000 rows share the rare id.
    for k, field in enumerate(ds.meta.fields):
        col = [r[14 + k] for rs in rows.values() for r in rs]
        vals, counts = np.unique(col, return_counts=True)
        frequent = int((counts >= 2).sum())
        assert field.cardinality == frequent + int(frequent < len(vals))


def test_criteo_sample_hetgmp_reference_encoding(shared_datasets, tmp_path):
    ref = encode_criteo_sample_hetgmp_reference(shared_datasets / "criteo-sample")
    rows = [r for n in ("train.csv", "dev.csv", "test.csv") for r in _criteo_rows(shared_datasets, n)]
    assert ref.sparse.shape == (8000, 26) and ref.num_rows == 37100
    off = 0
    for k in range(26):
        order: dict[str, int] = {}
        for r in rows:
            order.setdefault(r[14 + k], len(order))
        np.testing.assert_array_equal(ref.sparse[:, k], [off + order[r[14 + k]] for r in rows])
        off += len(order)
    rc = main(["preprocess", "criteo-sample", str(shared_datasets / "criteo-sample"),
               "--out", str(tmp_path / "ref"), "--hetgmp-reference", "--no-progress"])
    assert rc == 0
    ds = open_dataset(tmp_path / "ref")
    assert ds.meta.splits == {"train": 8000, "test": 0}
    np.testing.assert_array_equal(ds.train.sparse, ref.sparse)


def test_movielens(shared_datasets, tmp_path):
    ds = convert_movielens(shared_datasets / "movielens-100k", tmp_path / "ml", test_fraction=0.2)
    m = ds.meta
    assert [f.name for f in m.fields] == list(FIELDS)
    assert m.splits["train"] + m.splits["test"] == 100_000
    assert 0.18 < m.splits["test"] / 100_000 < 0.22
    card = {f.name: f.cardinality for f in m.fields}
    assert card["user"] == 943 and card["item"] == 1682 and card["gender"] == 2
    assert card["occupation"] == 21 and card["age_bucket"] <= 8 and card["primary_genre"] <= 19
    labels = np.concatenate([ds.train.labels.ravel(), ds.test.labels.ravel()])
    assert abs(labels.mean() - 0.554) < 0.001
    # Every user id of u.data maps to exactly one id of field "user" and back.
    users = [int(line.split("\t")[0]) for line in
             open(shared_datasets / "movielens-100k" / "u.data", encoding="latin-1")]
    again = convert_movielens(shared_datasets / "movielens-100k", tmp_path / "ml0",
                              test_fraction=0.0)
    pairs = set(zip(users, again.train.sparse[:, 0].tolist(), strict=True))
    assert len(pairs) == 943
    assert again.train.sparse[0, 0] == 0  # first appearance: first rating's user gets id 0
