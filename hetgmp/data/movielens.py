"""MovieLens 100K (``../shared/datasets/movielens-100k``) as a click data set.

One sample per rating of ``u.data``; label = rating >= 4 (55.4 % positive). Seven categorical
fields: ``user``, ``item``, ``age_bucket`` (age // 10), ``gender``, ``occupation``,
``zip_prefix`` (first 3 characters of the zip code), ``primary_genre`` (the first genre flagged
in ``u.item``, which is latin-1). No dense features. Ids per field in order of first appearance
in ``u.data`` (so the user and item ids follow the rating log, as HET-GMP's graph experiments
assume), or by descending frequency. Keys: the integers (user, item, age bucket, genre index,
-1 for none) by the ``int`` scheme, the strings (gender, occupation, zip prefix) by ``fnv1a64``,
so the saved vocabulary (``vocab/``) encodes these derived values of new ratings. Train/test: a rating goes to test when
``splitmix64(seed, line)`` falls below ``test_fraction`` (deterministic; 0 = everything train).

With ``multi_hot_genres`` (``--multi-hot-genres``, issue 34) an eighth field, ``genres``, is a
multi-hot field: every genre flagged in ``u.item`` for the rated item, in ``u.genre``'s order
(the genre indices, ``int`` keys; an item with no flag has an empty bag). Such a data set is
format version 2 (:mod:`hetgmp.data.multi_hot`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa

from hetgmp.data.bad_lines import BadInputError
from hetgmp.data.delimited_lists import take_lists
from hetgmp.data.format import Dataset, make_fields, write_dataset
from hetgmp.data.preprocess import random_split_mask
from hetgmp.data.vocab import KeyCounter, build_vocab, int_keys, string_keys
from hetgmp.data.vocab_files import write_vocabulary

FIELDS = ("user", "item", "age_bucket", "gender", "occupation", "zip_prefix", "primary_genre")
GENRES_FIELD = "genres"
_STRING_FIELDS = (3, 4, 5)  # gender, occupation, zip_prefix


@dataclasses.dataclass
class MovielensInput:
    """What the saved vocabulary records about MovieLens input (no raw-file reader)."""

    field_names: tuple[str, ...] = FIELDS
    dense_names: tuple[str, ...] = ()
    kind: str = "movielens-100k"
    multi_hot_names: tuple[str, ...] = ()

    @property
    def key_schemes(self) -> list[str]:
        single = ["fnv1a64" if f in _STRING_FIELDS else "int" for f in range(len(FIELDS))]
        return single + ["int"] * len(self.multi_hot_names)


def _rows(path: Path, sep: str, ncols: int, encoding: str) -> list[tuple[int, list[str]]]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    rows = []
    with open(path, encoding=encoding) as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            parts = line.split(sep)
            if len(parts) != ncols:
                raise BadInputError(f"{path}:line {lineno}: {len(parts)} fields, expected {ncols}")
            rows.append((lineno, parts))
    if not rows:
        raise BadInputError(f"{path}:line 1: file is empty")
    return rows


def _int(path: Path, lineno: int, what: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise BadInputError(f"{path}:line {lineno}: {what} {text!r} is not an integer") from None


def load_movielens_raw(src: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(raw keys uint64 [100000, 7], labels float32, u.data line numbers) of the ratings."""
    keys, labels, lines, _ = _load(Path(src))
    return keys, labels, lines


def load_genre_bags(src: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The ``genres`` bag of every rating, u.data's order: ``(keys uint64 [E], offsets int64
    [n + 1])``, the keys of the rated item's flagged genre indices."""
    _, _, _, bags = _load(Path(src))
    return bags


def _item_genres(path: Path) -> dict[int, list[int]]:
    """Every item's flagged genre indices (u.item's 19 flags, in u.genre's order)."""
    genres = {}
    for ln, r in _rows(path, "|", 24, "latin-1"):
        iid = _int(path, ln, "item id", r[0])
        flags = [v.strip() for v in r[5:24]]
        bad = next((v for v in flags if v not in ("0", "1")), None)
        if bad is not None:
            raise BadInputError(f"{path}:line {ln}: genre flag {bad!r} is not 0 or 1")
        genres[iid] = [g for g, v in enumerate(flags) if v == "1"]
    return genres


def _load(src: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """:func:`load_movielens_raw`'s arrays and :func:`load_genre_bags`'s bags, one read."""
    users = {}
    for ln, r in _rows(src / "u.user", "|", 5, "latin-1"):
        uid = _int(src / "u.user", ln, "user id", r[0])
        age = _int(src / "u.user", ln, "age", r[1])
        users[uid] = (age // 10, r[2], r[3], r[4][:3])
    genres = _item_genres(src / "u.item")
    data = _rows(src / "u.data", "\t", 4, "latin-1")
    n = len(data)
    keys = np.empty((n, len(FIELDS)), dtype=np.uint64)
    labels = np.empty(n, dtype=np.float32)
    lines = np.empty(n, dtype=np.int64)
    path = src / "u.data"
    raw = np.zeros((n, len(FIELDS)), dtype=np.int64)
    text: list[list[str]] = [[] for _ in _STRING_FIELDS]
    bag_of: list[list[int]] = []
    for k, (ln, r) in enumerate(data):
        uid = _int(path, ln, "user id", r[0])
        iid = _int(path, ln, "item id", r[1])
        rating = _int(path, ln, "rating", r[2])
        if uid not in users:
            raise BadInputError(f"{path}:line {ln}: user {uid} is not in u.user")
        if iid not in genres:
            raise BadInputError(f"{path}:line {ln}: item {iid} is not in u.item")
        if not 1 <= rating <= 5:
            raise BadInputError(f"{path}:line {ln}: rating {rating} is not in 1..5")
        age_b, gender, occ, zip3 = users[uid]
        raw[k, [0, 1, 2, 6]] = (uid, iid, age_b, genres[iid][0] if genres[iid] else -1)
        bag_of.append(genres[iid])
        for j, value in enumerate((gender, occ, zip3)):
            text[j].append(value)
        labels[k] = 1.0 if rating >= 4 else 0.0
        lines[k] = ln
    keys[:] = int_keys(raw.ravel()).reshape(raw.shape)
    for j, f in enumerate(_STRING_FIELDS):
        keys[:, f] = string_keys(pa.array(text[j], pa.string()))
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(b) for b in bag_of], out=offsets[1:])
    flat = np.fromiter((g for b in bag_of for g in b), dtype=np.int64, count=int(offsets[-1]))
    return keys, labels, lines, (int_keys(flat), offsets)


def _source_meta(
    src: str | Path, id_order: str, test_fraction: float, seed: int, genres: bool
) -> dict:
    """meta.json's ``source``: the input, the derived fields, ids and split."""
    bag = {GENRES_FIELD: "multi-hot: every genre flagged in u.item, in u.genre's order"}
    return {
        "kind": "movielens-100k",
        "input": str(src),
        "label": "rating >= 4",
        "fields": {
            "age_bucket": "age // 10",
            "zip_prefix": "first 3 characters of zip",
            "primary_genre": "first genre flagged in u.item (latin-1), -1 for none",
            **(bag if genres else {}),
        },
        "id_order": id_order,
        "split": "random by splitmix64(seed, u.data line)",
        "test_fraction": test_fraction,
        "seed": seed,
    }


def convert_movielens(
    src: str | Path,
    out: str | Path,
    *,
    test_fraction: float = 0.1,
    seed: int = 0,
    id_order: str = "first-appearance",
    overwrite: bool = False,
    multi_hot_genres: bool = False,
) -> Dataset:
    """Write MovieLens 100K as a dataset directory (see the module docstring)."""
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"--test-fraction must be in [0, 1), got {test_fraction}")
    keys, labels, lines, bags = _load(Path(src))
    lists = [bags] if multi_hot_genres else []
    names = [*FIELDS, *([GENRES_FIELD] if multi_hot_genres else [])]
    counter = KeyCounter(len(names), track_first=True)
    counter.add(keys, lists)
    vocabs = [
        build_vocab(*counter.field(f), min_count=1, id_order=id_order) for f in range(len(names))
    ]
    every = make_fields(names, [v.cardinality for v in vocabs])
    fields, multi_hot = every[: len(FIELDS)], every[len(FIELDS) :]
    ids = np.stack(
        [v.lookup(keys[:, f]) + fields[f].offset for f, v in enumerate(vocabs[: len(FIELDS)])], 1
    )
    encoded = [
        (vocabs[len(FIELDS) + k].lookup(values) + multi_hot[k].offset, offsets)
        for k, (values, offsets) in enumerate(lists)
    ]
    is_test = random_split_mask(seed, 0, lines, test_fraction)
    # Empty splits are left out: the writer creates them empty on close.
    splits: dict[str, tuple] = {
        name: (ids[m], None, labels[m], *([take_lists(encoded, m)] if encoded else []))
        for name, m in (("train", ~is_test), ("test", is_test))
        if m.any()
    }
    return write_dataset(
        out,
        fields,
        splits,
        num_dense=0,
        name="movielens-100k",
        overwrite=overwrite,
        extra_files=lambda tmp: write_vocabulary(
            tmp,
            every,
            vocabs,
            MovielensInput(multi_hot_names=tuple(names[len(FIELDS) :])),
            min_count=1,
            id_order=id_order,
            reserve_rare=False,
        ),  # fmt: skip
        source=_source_meta(src, id_order, test_fraction, seed, multi_hot_genres),
        stats={
            "positive_rate": float(labels.mean()),
            "distinct_values": [v.num_values for v in vocabs],
        },
        multi_hot=multi_hot,
    )
