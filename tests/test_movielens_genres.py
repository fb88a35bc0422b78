"""`hetgmp preprocess movielens --multi-hot-genres` (issue 34): every genre flagged for the rated
item as a multi-hot field. The always-run test writes small files in MovieLens-100k's format;
the real data (read in place from ../shared/datasets, never copied) is checked when present."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hetgmp.cli import main as cli_main
from hetgmp.data.format import open_dataset
from hetgmp.data.movielens import FIELDS
from hetgmp.data.vocab_store import Vocabulary

ITEM_GENRES = {1: [3, 4, 5], 2: [1], 3: []}  # item -> flagged genre indices (0..18)


def _write_ml(root: Path) -> Path:
    root.mkdir()
    (root / "u.user").write_text("1|24|M|technician|85711\n2|53|F|other|94043\n")
    items = []
    for iid, flagged in ITEM_GENRES.items():
        flags = ["1" if g in flagged else "0" for g in range(19)]
        items.append("|".join([str(iid), f"Movie {iid} (1995)", "01-Jan-1995", "", "url", *flags]))
    (root / "u.item").write_text("\n".join(items) + "\n", encoding="latin-1")
    ratings = [(1, 1, 5), (2, 2, 3), (1, 3, 4), (2, 1, 1), (1, 2, 4)]
    (root / "u.data").write_text("".join(f"{u}\t{i}\t{r}\t881250949\n" for u, i, r in ratings))
    return root


def _bags(out: Path, split: str = "train") -> list[list[int]]:
    mh = getattr(open_dataset(out), split).multi_hot[0]
    return [mh.values[a:b].tolist() for a, b in zip(mh.offsets[:-1], mh.offsets[1:], strict=True)]


def test_genres_become_a_multi_hot_field(tmp_path: Path) -> None:
    src = _write_ml(tmp_path / "ml")
    out = tmp_path / "out"
    assert cli_main(["preprocess", "movielens", str(src), "--out", str(out), "--test-fraction",
                     "0", "--multi-hot-genres", "--no-progress"]) == 0  # fmt: skip
    ds = open_dataset(out)
    assert [f.name for f in ds.meta.fields] == list(FIELDS) and ds.meta.version == 2
    assert [f.name for f in ds.meta.multi_hot] == ["genres"]
    vocab = Vocabulary.load(out)
    g = {i: vocab.encode_values("genres", [i])[0] for i in (1, 3, 4, 5)}
    assert len(set(g.values())) == 4  # four distinct genres, four ids
    items = [1, 2, 3, 1, 2]  # u.data's items, in order
    assert _bags(out) == [[g[i] for i in ITEM_GENRES[it]] for it in items]
    # primary_genre stays the first flagged genre (-1 for none), a single-hot field as before
    prim = vocab.encode_values("primary_genre", [3, 1, -1, 3, 1]).tolist()
    assert ds.train.sparse[:, FIELDS.index("primary_genre")].tolist() == prim
    assert cli_main(["dataset", "verify", str(out)]) == 0
    # without the flag: the single-hot data set of before (version 1, no bags)
    plain = tmp_path / "plain"
    assert cli_main(["preprocess", "movielens", str(src), "--out", str(plain),
                     "--test-fraction", "0"]) == 0  # fmt: skip
    assert open_dataset(plain).meta.version == 1 and not open_dataset(plain).meta.multi_hot
    assert np.array_equal(open_dataset(plain).train.sparse, ds.train.sparse)


def test_bad_genre_flags_are_named_by_line(tmp_path: Path, capsys) -> None:
    src = _write_ml(tmp_path / "ml")
    text = (src / "u.item").read_text(encoding="latin-1").splitlines()
    text[1] = text[1][:-1] + "x"
    (src / "u.item").write_text("\n".join(text) + "\n", encoding="latin-1")
    assert cli_main(["preprocess", "movielens", str(src), "--out", str(tmp_path / "o"),
                     "--multi-hot-genres"]) == 2  # fmt: skip
    assert f"{src / 'u.item'}:line 2: genre flag 'x' is not 0 or 1" in capsys.readouterr().err


def test_real_movielens_genres(shared_datasets: Path, tmp_path: Path) -> None:
    src = shared_datasets / "movielens-100k"
    out = tmp_path / "ml"
    assert cli_main(["preprocess", "movielens", str(src), "--out", str(out), "--test-fraction",
                     "0.1", "--multi-hot-genres", "--no-progress"]) == 0  # fmt: skip
    ds = open_dataset(out)
    genres = ds.meta.multi_hot[0]
    assert genres.cardinality == 19 and len(ds.train) + len(ds.test) == 100_000
    lengths = np.concatenate([ds.train.multi_hot[0].lengths(), ds.test.multi_hot[0].lengths()])
    # (every item has a flag, at most 6; popular items carry more: 2.126 genres per rating)
    assert lengths.min() == 1 and lengths.max() == 6 and 2.1 < lengths.mean() < 2.15
    # each rating's bag is its item's flags in u.item: the same item always has the same bag
    vocab = Vocabulary.load(out)
    flags = {}
    for line in (src / "u.item").read_text(encoding="latin-1").splitlines():
        parts = line.split("|")
        flags[int(parts[0])] = [g for g, v in enumerate(parts[5:24]) if v == "1"]
    train = ds.train
    bags = _bags(out)
    item_ids = {iid: int(vocab.encode_values("item", [iid])[0]) for iid in flags}
    by_id = {v: k for k, v in item_ids.items()}
    for row in range(0, len(train), 97):
        iid = by_id[int(train.sparse[row, FIELDS.index("item")])]
        assert bags[row] == vocab.encode_values("genres", flags[iid]).tolist()
    assert cli_main(["dataset", "verify", str(out)]) == 0
