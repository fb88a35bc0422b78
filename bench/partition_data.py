"""Private readers of the real samples for the partition benchmarks (read in place, never copied).

They build the encodings HET-GMP's reference figures assume, straight from the raw files:

* ``movielens-100k``: every rating of ``u.data`` is a sample with 7 fields -- user, item,
  age bucket (age // 10), gender, occupation, zip prefix (first 3 characters), primary genre
  (first genre flagged in ``u.item``); ids per field in order of first appearance.
* ``criteo-sample``: all 8000 rows of train/dev/test, the 26 categorical columns, ids per field in
  order of first appearance, the empty string being a value like any other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def first_appearance_ids(columns: list[list[object]]) -> tuple[np.ndarray, int]:
    """Global ids [N, F] (field after field) with ids per field in order of first appearance."""
    out = np.empty((len(columns[0]), len(columns)), dtype=np.int64)
    offset = 0
    for f, col in enumerate(columns):
        vocab: dict[object, int] = {}
        out[:, f] = [vocab.setdefault(v, len(vocab)) for v in col]
        out[:, f] += offset
        offset += len(vocab)
    return out, offset


def movielens_graph(root: Path) -> tuple[np.ndarray, int]:
    """(ids [100000, 7], number of rows) of ``movielens-100k``."""
    users = {}
    for line in (root / "u.user").read_text(encoding="latin-1").splitlines():
        uid, age, gender, occ, zipc = line.split("|")
        users[uid] = (int(age) // 10, gender, occ, zipc[:3])
    genre = {}
    for line in (root / "u.item").read_text(encoding="latin-1").splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        flags = parts[5:24]
        genre[parts[0]] = next((g for g, v in enumerate(flags) if v == "1"), -1)
    cols: list[list[object]] = [[] for _ in range(7)]
    for line in (root / "u.data").read_text(encoding="latin-1").splitlines():
        uid, iid, _rating, _ts = line.split("\t")
        row = (uid, iid, *users[uid], genre[iid])
        for f, v in enumerate(row):
            cols[f].append(v)
    return first_appearance_ids(cols)


def criteo_sample_graph(root: Path) -> tuple[np.ndarray, int]:
    """(ids [8000, 26], number of rows) of ``criteo-sample`` (train, dev, test in that order)."""
    cols: list[list[object]] = [[] for _ in range(26)]
    for name in ("train.csv", "dev.csv", "test.csv"):
        for line in (root / name).read_text(encoding="latin-1").splitlines():
            parts = line.split("\t")
            for f in range(26):
                cols[f].append(parts[14 + f])
    return first_appearance_ids(cols)
