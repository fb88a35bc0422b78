"""`hetgmp preprocess csv --multi-hot COL[:SEP]` (issue 34): lists in a column through the
vocabulary (--min-count, --vocab-from, --grow-vocab), the ragged layout, the splits, bad lines by
file:line, and `hetgmp partition` on the result. Real files, the real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetgmp.cli import main as cli_main
from hetgmp.data.delimited_lists import parse_multi_hot_arg
from hetgmp.data.format import open_dataset
from hetgmp.data.vocab import string_keys
from hetgmp.data.vocab_store import Vocabulary

ROWS = [  # label, user, tags (';'-separated), genres ('|'), x
    "1,u1,t1;t2;t1,g1|g2,0.5",
    "0,u2,,g2,1.5",
    "1,u1,t3,,2",
    "0,u3,t1;t2,g1,3",
    "1,u2,t2,g2|g2,4",
]


def _csv(path: Path, rows: list[str]) -> Path:
    path.write_text("label,user,tags,genres,x\n" + "\n".join(rows) + "\n")
    return path


def _pre(src: Path, out: Path, *extra: str) -> int:
    return cli_main(["preprocess", "csv", str(src), "--label", "label", "--dense", "x",
                     "--categorical", "user", "--multi-hot", "tags:;", "--multi-hot", "genres",
                     "--out", str(out), "--no-progress", *extra])  # fmt: skip


def _lists(out: Path, split: str = "train", k: int = 0) -> list[list[int]]:
    mh = getattr(open_dataset(out), split).multi_hot[k]
    return [mh.values[a:b].tolist() for a, b in zip(mh.offsets[:-1], mh.offsets[1:], strict=True)]


def _ids(out: Path, field: int, values: list[str]) -> list[int]:
    """The global ids the saved vocabulary gives ``values`` of field ``field`` (a key lookup)."""
    import pyarrow as pa

    vocab = Vocabulary.load(out)
    f = vocab.fields[field]
    local, _ = f.encode_local(string_keys(pa.array(values)))
    return (local + f.offset).tolist()


def test_lists_go_through_the_vocabulary_into_the_ragged_layout(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _pre(_csv(tmp_path / "d.csv", ROWS), out, "--test-fraction", "0") == 0
    ds = open_dataset(out)
    assert ds.meta.version == 2 and [f.name for f in ds.meta.multi_hot] == ["tags", "genres"]
    user, tags, genres = ds.meta.fields[0], *ds.meta.multi_hot
    assert (tags.offset, tags.cardinality) == (user.cardinality, 3)  # fields after single-hot
    assert genres.offset == tags.offset + 3 and ds.meta.num_embeddings == 3 + 3 + 2
    t1, t2, t3 = _ids(out, 1, ["t1", "t2", "t3"])
    assert _lists(out) == [[t1, t2, t1], [], [t3], [t1, t2], [t2]]  # repeats and order kept
    g1, g2 = _ids(out, 2, ["g1", "g2"])
    assert _lists(out, k=1) == [[g1, g2], [g2], [], [g1], [g2, g2]]
    assert len({t1, t2, t3}) == 3 and cli_main(["dataset", "verify", str(out)]) == 0
    # the data set partitions, its lists counted (tests/test_partition_multi_hot.py)
    assert cli_main(["partition", "--data", str(out), "-n", "2", "-o", str(tmp_path / "p.npz"),
                     "--no-progress"]) == 0  # fmt: skip


def test_min_count_counts_every_list_value(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _pre(_csv(tmp_path / "d.csv", ROWS), out, "--test-fraction", "0",
                "--min-count", "2") == 0  # fmt: skip
    t1, t2, t3 = _ids(out, 1, ["t1", "t2", "t3"])
    assert t3 not in (t1, t2) and t1 != t2  # t1 3x and t2 3x keep ids, t3 (once) is rare
    rare = open_dataset(out).meta.multi_hot[0]
    assert open_dataset(out).meta.stats["rare_values"][1] == 1 and t3 < rare.offset + 3
    assert _lists(out)[2] == [t3]


def test_vocab_from_reuses_the_list_ids(tmp_path: Path, capsys) -> None:
    first = tmp_path / "first"
    assert _pre(_csv(tmp_path / "d.csv", ROWS), first, "--test-fraction", "0") == 0
    t1, t2 = _ids(first, 1, ["t1", "t2"])
    new = _csv(tmp_path / "n.csv", ["1,u9,t2;t9;t1,g1,1", "0,u1,t1,,2"])
    again = tmp_path / "again"
    assert _pre(new, again, "--test-fraction", "0", "--vocab-from", str(first)) == 0
    unseen = (
        Vocabulary.load(first).fields[1].unseen_id + open_dataset(first).meta.multi_hot[0].offset
    )
    assert _lists(again) == [[t2, unseen, t1], [t1]]  # t9 is not in the vocabulary
    assert open_dataset(again).meta.num_embeddings == open_dataset(first).meta.num_embeddings
    grown = tmp_path / "grown"
    assert _pre(new, grown, "--test-fraction", "0", "--vocab-from", str(first),
                "--grow-vocab") == 0  # fmt: skip
    # growing keeps every old local id and gives t9 a new one (the user field grew by u9, so
    # the tags' offset moved by one)
    off = open_dataset(first).meta.multi_hot[0].offset
    g_off = open_dataset(grown).meta.multi_hot[0].offset
    assert g_off == off + 1
    local = [i - g_off for i in _lists(grown)[0]]
    assert local[::2] == [t2 - off, t1 - off] and local[1] == 3  # t9: the new local id 3
    assert _ids(grown, 1, ["t9"]) == [g_off + 3]
    # inputs whose fields differ from the vocabulary's are refused, naming both
    rc = cli_main(["preprocess", "csv", str(new), "--label", "label", "--dense", "x",
                   "--categorical", "user", "--multi-hot", "tags:;", "--out",
                   str(tmp_path / "x"), "--vocab-from", str(first)])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert "['user', 'tags'] differ from the vocabulary's ['user', 'tags', 'genres']" in err


def test_a_random_split_keeps_each_row_with_its_lists(tmp_path: Path) -> None:
    rows = [f"{i % 2},u{i % 7},{';'.join(f't{j}' for j in range(i % 4))},g{i % 3},{i}"
            for i in range(400)]  # fmt: skip
    out = tmp_path / "out"
    assert _pre(_csv(tmp_path / "d.csv", rows), out, "--split", "random",
                "--test-fraction", "0.3") == 0  # fmt: skip
    ds = open_dataset(out)
    assert 60 < len(ds.test) < 180 and len(ds.train) + len(ds.test) == 400
    for split in ("train", "test"):  # row i has i % 4 tags: the dense value x = i says which
        x = getattr(ds, split).dense[:, 0].round().astype(int)
        lengths = [len(t) for t in _lists(out, split)]
        assert lengths == (x % 4).tolist()


def test_bad_list_values_are_named_by_file_and_line(tmp_path: Path, capsys) -> None:
    src = _csv(tmp_path / "d.csv", [*ROWS[:2], "1,u1,t1;;t2,g1,1", "0,u1,t2,g1|,2"])
    assert _pre(src, tmp_path / "out", "--test-fraction", "0") == 2
    err = capsys.readouterr().err
    assert f"{src}:line 4: column tags: 't1;;t2' is a ';'-separated list with an empty" in err
    assert _pre(src, tmp_path / "out", "--test-fraction", "0", "--on-bad-line", "skip") == 0
    assert len(_lists(tmp_path / "out")) == 2  # lines 4 and 5 skipped (5: a trailing '|')
    assert "skipped 2 bad lines" in capsys.readouterr().err
    bad_sep = ["preprocess", "csv", str(src), "--label", "label", "--categorical", "user",
               "--multi-hot", "tags:,", "--out", str(tmp_path / "y")]  # fmt: skip
    assert cli_main(bad_sep) == 2
    assert "separator ',' must be non-empty and differ from the delimiter" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("arg", "want"), [("tags", ("tags", "|")), ("tags:;", ("tags", ";")), ("a:b:|", ("a:b", "|"))]
)
def test_multi_hot_argument(arg: str, want: tuple[str, str]) -> None:
    assert parse_multi_hot_arg(arg) == want
