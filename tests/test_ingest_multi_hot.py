"""Multi-hot fields in parquet (list columns) and libfm (repeated fields) (issue 34): bags
through the vocabulary (--min-count per value, --vocab-from), the ragged layout, bad rows and
lines named with their field. Real files, the real CLI."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hetgmp.cli import main as cli_main
from hetgmp.data.format import open_dataset
from hetgmp.data.vocab_store import Vocabulary


def _lists(out: Path, k: int = 0, split: str = "train") -> list[list[int]]:
    mh = getattr(open_dataset(out), split).multi_hot[k]
    return [mh.values[a:b].tolist() for a, b in zip(mh.offsets[:-1], mh.offsets[1:], strict=True)]


def _ids(out: Path, field: str, values: list) -> list[int]:
    """Global ids the saved vocabulary gives raw ``values`` (by the field's key scheme)."""
    return Vocabulary.load(out).encode_values(field, values).tolist()


# ---- parquet: list columns ------------------------------------------------------------------

TAGS = [["a", "b", "a"], None, ["c"], ["a", "b"], []]
ITEMS = [[7, 8], [8], [], None, [9, 7, 7]]


def _parquet(path: Path, tags: list = TAGS, items: list = ITEMS) -> Path:
    n = len(tags)
    table = pa.table(
        {
            "label": pa.array([1, 0, 1, 0, 1][:n], pa.int8()),
            "user": pa.array(["u1", "u2", "u1", "u3", "u2"][:n]),
            "tags": pa.array(tags, pa.list_(pa.string())),
            "items": pa.array(items, pa.large_list(pa.int64())),
            "x": pa.array([0.5, 1.5, 2.0, 3.0, 4.0][:n]),
        }
    )
    pq.write_table(table, path, row_group_size=2)  # (several row groups: bags cross batches)
    return path


def _pre_parquet(src: Path, out: Path, *extra: str) -> int:
    return cli_main(["preprocess", "parquet", str(src), "--label", "label", "--dense", "x",
                     "--categorical", "user", "--multi-hot", "tags", "--multi-hot", "items",
                     "--test-fraction", "0", "--out", str(out), "--no-progress", *extra])  # fmt: skip


def test_parquet_list_columns_become_bags(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _pre_parquet(_parquet(tmp_path / "d.parquet"), out) == 0
    meta = open_dataset(out).meta
    assert [f.name for f in meta.multi_hot] == ["tags", "items"] and meta.version == 2
    a, b, c = _ids(out, "tags", ["a", "b", "c"])
    assert _lists(out, 0) == [[a, b, a], [], [c], [a, b], []]  # a null list is an empty bag
    i7, i8, i9 = _ids(out, "items", [7, 8, 9])  # (integers keyed by the int scheme)
    assert _lists(out, 1) == [[i7, i8], [i8], [], [], [i9, i7, i7]]
    assert len({a, b, c, i7, i8, i9}) == 6 and cli_main(["dataset", "verify", str(out)]) == 0
    schemes = {f.name: f.key_scheme for f in Vocabulary.load(out).fields}
    assert schemes == {"user": "fnv1a64", "tags": "fnv1a64", "items": "int"}


def test_parquet_min_count_and_vocab_from_per_bag_value(tmp_path: Path) -> None:
    src = _parquet(tmp_path / "d.parquet")
    counted = tmp_path / "counted"
    assert _pre_parquet(src, counted, "--min-count", "2") == 0
    a, b, c = _ids(counted, "tags", ["a", "b", "c"])
    # a is seen 3x and b 2x in the bags: own ids; c (once) takes the field's rare id, which
    # values never seen share
    assert len({a, b, c}) == 3 and _ids(counted, "tags", ["zzz"]) == [c]
    assert open_dataset(counted).meta.stats["rare_values"][1] == 1
    i7, i8, i9 = _ids(counted, "items", [7, 8, 9])
    assert i9 not in (i7, i8) and _lists(counted, 1)[4] == [i9, i7, i7]
    # --vocab-from: the first set's ids for known values, the unseen id for new ones
    first = tmp_path / "first"
    assert _pre_parquet(src, first) == 0
    new = _parquet(tmp_path / "n.parquet", tags=[["c", "new", "a"]], items=[[9]])
    again = tmp_path / "again"
    assert _pre_parquet(new, again, "--vocab-from", str(first)) == 0
    a, c = _ids(first, "tags", ["a", "c"])
    unseen = _ids(first, "tags", ["never-seen"])[0]
    assert _lists(again, 0) == [[c, unseen, a]] and _lists(again, 1) == [_ids(first, "items", [9])]


def test_parquet_bad_bags_are_named_by_row_and_column(tmp_path: Path, capsys) -> None:
    src = _parquet(tmp_path / "d.parquet", tags=[["a"], ["b"], ["a", None], ["a"], ["b", ""]])
    assert _pre_parquet(src, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"{src}:row 3: column tags: value 1 of the list ['a', None] is null or empty" in err
    assert _pre_parquet(src, tmp_path / "out", "--on-bad-line", "skip") == 0
    assert len(_lists(tmp_path / "out")) == 3  # rows 3 and 5 dropped with their bags
    assert cli_main(["preprocess", "parquet", str(src), "--label", "label", "--categorical",
                     "user", "--multi-hot", "x", "--out", str(tmp_path / "y")]) == 2  # fmt: skip
    assert "--multi-hot column 'x' has type double; expected a list column" in (
        capsys.readouterr().err
    )


# ---- libfm: repeated fields -----------------------------------------------------------------

LIBFM = [  # field 0 single-hot, field 1 a bag, field 2 dense
    "1 0:5:1 1:10:1 1:11:1 1:10:1 2:3:0.5",
    "0 0:6:1 2:1:2",  # no field 1: an empty bag
    "1 1:12:1 0:5:1 1:11:1",
    "0 0:6:1 1:10:1",
]


def _pre_libfm(src: Path, out: Path, *extra: str) -> int:
    return cli_main(["preprocess", "libsvm", str(src), "--dense-fields", "2",
                     "--multi-hot-fields", "1", "--test-fraction", "0", "--out", str(out),
                     "--no-progress", *extra])  # fmt: skip


def test_libfm_repeated_fields_form_bags(tmp_path: Path) -> None:
    src = tmp_path / "d.libfm"
    src.write_text("\n".join(LIBFM) + "\n")
    out = tmp_path / "out"
    assert _pre_libfm(src, out) == 0
    ds = open_dataset(out)
    assert [f.name for f in ds.meta.fields] == ["f0"] and [f.name for f in ds.meta.multi_hot] == [
        "f1"
    ]
    t10, t11, t12 = _ids(out, "f1", [10, 11, 12])
    assert _lists(out) == [[t10, t11, t10], [], [t12, t11], [t10]]  # line order, repeats kept
    assert ds.train.dense[:, 0].tolist() == [0.5, 2.0, 0.0, 0.0]
    assert cli_main(["dataset", "verify", str(out)]) == 0
    counted = tmp_path / "counted"
    assert _pre_libfm(src, counted, "--min-count", "2") == 0
    t10, t11, t12 = _ids(counted, "f1", [10, 11, 12])
    assert t12 != t10 != t11 and _ids(counted, "f1", [99]) == [t12]  # 12 (once) is rare
    kept = [Vocabulary.load(d).field("f1").keys.size for d in (out, counted)]
    assert kept == [3, 2] and open_dataset(counted).meta.stats["rare_values"][1] == 1
    again = tmp_path / "again"
    new = tmp_path / "n.libfm"
    new.write_text("1 0:5:1 1:11:1 1:99:1 2:1:1\n")
    assert _pre_libfm(new, again, "--vocab-from", str(out)) == 0
    assert _lists(again) == [[_ids(out, "f1", [11])[0], _ids(out, "f1", [99])[0]]]


@pytest.mark.parametrize(
    ("line", "expect"),
    [
        ("1 0:5:1 0:6:1 1:10:1", "line 2: field 0 appears twice"),  # single-hot: still bad
        ("1 0:5:1 1:x:1", "line 2: token '1:x:1' is not field:id:value"),  # a bad bag token
        ("1 0:5:1 1:10", "line 2: token '1:10' is not field:id:value"),
    ],
)
def test_libfm_bad_lines_name_line_and_field(tmp_path: Path, capsys, line: str, expect) -> None:
    src = tmp_path / "d.libfm"
    src.write_text(f"{LIBFM[0]}\n{line}\n")
    assert _pre_libfm(src, tmp_path / "out") == 2
    assert f"{src}:{expect}" in capsys.readouterr().err


def test_multi_hot_fields_need_field_numbers_in_the_lines(tmp_path: Path, capsys) -> None:
    src = tmp_path / "d.svm"
    src.write_text("1 5:1 7:1 8:1\n0 6:1 8:1\n")
    assert cli_main(["preprocess", "libsvm", str(src), "--multi-hot-fields", "1",
                     "--out", str(tmp_path / "o")]) == 2  # fmt: skip
    assert "--multi-hot-fields needs libfm lines (field:id:value) or a --field-map" in (
        capsys.readouterr().err
    )
    assert cli_main(["preprocess", "libsvm", str(src), "--multi-hot-fields", "1",
                     "--field-map", str(_map(tmp_path)), "--out", str(tmp_path / "o")]) == 0  # fmt: skip
    assert [len(b) for b in _lists(tmp_path / "o")] == [2, 1]


def _map(tmp_path: Path) -> Path:
    path = tmp_path / "fields.txt"
    path.write_text("5 0\n6 0\n7 1\n8 1\n")
    return path
