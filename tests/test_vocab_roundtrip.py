"""The saved vocabulary: preprocess a file, encode a second one with ``--vocab-from``.

Seen values must get the ids of the first data set, unseen ones the field's rare id (or the
documented fallback), and the layout (fields, offsets, num_embeddings) must not change.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_ingest_criteo import criteo_lines, write

from hetgmp.cli import main
from hetgmp.data.format import open_dataset
from hetgmp.data.libsvm import LibsvmSource
from hetgmp.data.parquet_reader import ParquetSource
from hetgmp.data.preprocess import PreprocessOptions, preprocess
from hetgmp.data.vocab_store import VocabError, Vocabulary

CLI = ["--no-progress", "--test-fraction", "0"]


def all_ids(ds) -> np.ndarray:
    return np.concatenate([np.asarray(ds.train.sparse), np.asarray(ds.test.sparse)])


def raw_to_id(rows: list[list[str]], ids: np.ndarray) -> list[dict[str, int]]:
    """Per field, raw value -> global id as the first data set assigned it (one id each)."""
    maps: list[dict[str, int]] = [{} for _ in range(ids.shape[1])]
    for row, r in zip(rows, ids, strict=True):
        for f, (v, i) in enumerate(zip(row, r, strict=True)):
            assert maps[f].setdefault(v, int(i)) == int(i)
    return maps


def expected_ids(rows, maps, vocab: Vocabulary) -> np.ndarray:
    """Seen value -> its id in the first data set; unseen -> offset + the field's rare id."""
    out = np.empty((len(rows), len(maps)), np.int64)
    for k, row in enumerate(rows):
        for f, v in enumerate(row):
            fv = vocab.fields[f]
            out[k, f] = maps[f].get(v, fv.offset + fv.unseen_id)
    return out


def unseen_criteo_lines(n: int) -> list[str]:
    """Criteo lines whose categoricals are partly values the generator never makes."""
    lines = []
    for k, line in enumerate(criteo_lines(n, seed=7)):
        parts = line.split("\t")
        for f in range(14, 40, 3):
            parts[f] = f"{0xF0000000 + 17 * k + f:08x}"
        lines.append("\t".join(parts))
    return lines


def test_criteo_roundtrip_seen_and_unseen(tmp_path):
    first = criteo_lines(400, seed=0)
    a = write(tmp_path / "a.tsv", first)
    second = first[:150] + unseen_criteo_lines(120) + criteo_lines(100, seed=3)
    b = write(tmp_path / "b.tsv", second)
    assert main(["preprocess", "criteo", str(a), "--out", str(tmp_path / "A"), "--min-count", "2",
                 *CLI]) == 0  # fmt: skip
    assert main(["preprocess", "criteo", str(b), "--out", str(tmp_path / "B"),
                 "--vocab-from", str(tmp_path / "A"), *CLI]) == 0  # fmt: skip
    da, db = open_dataset(tmp_path / "A"), open_dataset(tmp_path / "B")
    assert [vars(f) for f in db.meta.fields] == [vars(f) for f in da.meta.fields]
    assert db.meta.num_embeddings == da.meta.num_embeddings
    vocab = Vocabulary.load(tmp_path / "A")
    # min-count 2 leaves the larger fields a rare id (the smallest keep every value).
    changed = list(range(0, 26, 3))  # fields of unseen_criteo_lines
    assert sum(vocab.fields[f].rare_id is not None for f in changed) >= 6
    cats = [line.split("\t")[14:] for line in first]
    maps = raw_to_id(cats, all_ids(da))
    new = [line.split("\t")[14:] for line in second]
    want = expected_ids(new, maps, vocab)
    np.testing.assert_array_equal(all_ids(db), want)
    np.testing.assert_array_equal(all_ids(db)[:150], all_ids(da)[:150])
    # Unseen values took the rare id (where the field has one), and were counted.
    for f in changed:
        fv = vocab.fields[f]
        assert fv.unseen_id == (fv.rare_id if fv.rare_id is not None else fv.missing_id)
        assert (all_ids(db)[150:270, f] == fv.offset + fv.unseen_id).all()
        assert db.meta.stats["values_not_in_vocabulary"][f] >= 120
    assert db.meta.source["vocab_from"] == str(tmp_path / "A")
    # Dense values are transformed as in the first data set.
    np.testing.assert_array_equal(
        np.asarray(db.train.dense)[:150], np.asarray(da.train.dense)[:150]
    )
    # The Python API gives the same ids: raw files (what predict reads), raw values, keys.
    got = np.concatenate([blk.ids for blk in vocab.encode_files([b])])
    np.testing.assert_array_equal(got, want)
    col = [row[0] for row in new]
    np.testing.assert_array_equal(vocab.encode_values("C1", col), want[:, 0])
    np.testing.assert_array_equal(vocab.encode_values(0, col), want[:, 0])
    # The new data set carries the vocabulary, so it can itself be a --vocab-from source.
    assert Vocabulary.load(tmp_path / "B").num_embeddings == da.meta.num_embeddings


def _csv(path: Path, rows: list[dict[str, str]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["click", "price", "site", "ad"], lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path


def _csv_rows(n: int, seed: int, sites: list[str]) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "click": str(int(rng.random() < 0.4)),
            "price": "" if rng.random() < 0.1 else f"{rng.normal() * 10:.3f}",
            "site": str(rng.choice(sites)),
            "ad": f"ad{int(rng.zipf(1.6)) % 40}",
        }
        for _ in range(n)
    ]


def test_csv_roundtrip_seen_unseen_and_mismatches(tmp_path, capsys):
    first = _csv_rows(300, 0, ["news", "shop", "", "sport", "blog x"])
    second = first[:50] + _csv_rows(200, 1, ["news", "never seen", "", "other", "shop"])
    a, b = _csv(tmp_path / "a.csv", first), _csv(tmp_path / "b.csv", second)
    spec = ["--label", "click", "--dense", "price", "--categorical", "site", "ad",
            "--dense-transform", "log"]  # fmt: skip
    assert main(["preprocess", "csv", str(a), *spec, "--out", str(tmp_path / "A"),
                 "--reserve-rare-id", *CLI]) == 0  # fmt: skip
    assert main(["preprocess", "csv", str(b), *spec, "--out", str(tmp_path / "B"),
                 "--vocab-from", str(tmp_path / "A"), *CLI]) == 0  # fmt: skip
    da, db = open_dataset(tmp_path / "A"), open_dataset(tmp_path / "B")
    vocab = Vocabulary.load(tmp_path / "A")
    # --reserve-rare-id: min-count 1 leaves nothing rare, yet each field has its own rare id.
    assert [f.rare_id for f in vocab.fields] == [f.cardinality - 1 for f in da.meta.fields]
    assert [f.key_scheme for f in vocab.fields] == ["fnv1a64", "fnv1a64"]
    maps = raw_to_id([[r["site"], r["ad"]] for r in first], all_ids(da))
    want = expected_ids([[r["site"], r["ad"]] for r in second], maps, vocab)
    np.testing.assert_array_equal(all_ids(db), want)
    assert db.meta.num_embeddings == da.meta.num_embeddings
    site = vocab.fields[0]
    assert vocab.encode_values("site", ["never seen", "news"]).tolist() == [
        site.offset + site.rare_id, maps[0]["news"]]  # fmt: skip
    price = np.array([[float(r["price"]) if r["price"] else np.nan] for r in second])
    np.testing.assert_allclose(db.train.dense, vocab.transform_dense(price), rtol=1e-6)
    # Inputs that do not fit the vocabulary are refused, naming its manifest.
    manifest = str(tmp_path / "A" / "vocab" / "manifest.json")
    for extra, what in (
        (["--label", "click", "--dense", "price", "--categorical", "site", "--dense-transform",
          "log"], "categorical fields"),
        ([*spec[:-1], "none"], "dense transform"),
    ):  # fmt: skip
        capsys.readouterr()
        assert main(["preprocess", "csv", str(b), *extra, "--out", str(tmp_path / "C"),
                     "--vocab-from", str(tmp_path / "A"), *CLI]) == 2  # fmt: skip
        err = capsys.readouterr().err
        assert f"{manifest}: " in err and what in err
        assert not (tmp_path / "C").exists()
    with pytest.raises(VocabError, match="--min-count 5 conflicts with --vocab-from"):
        preprocess(_csv_source(b), tmp_path / "C",
                   PreprocessOptions(progress=False, min_count=5, vocab_from=tmp_path / "A"))  # fmt: skip


def _csv_source(path: Path):
    from hetgmp.data.delimited import DelimitedSource, resolve_columns

    spec = resolve_columns(path, label="click", dense=["price"], categorical=["site", "ad"],
                           delimiter=",", header=True, quote_char=None, dense_transform="log")  # fmt: skip
    return DelimitedSource([path], spec)


def test_field_without_rare_id_uses_missing_then_last_id(tmp_path):
    # min-count 1, no reservation: no rare ids. C1 of these lines is never empty, C2 sometimes.
    lines = criteo_lines(200, seed=1)
    lines = ["\t".join(p[:14] + [p[14] or "0000abcd"] + p[15:]) for p in
             (line.split("\t") for line in lines)]  # fmt: skip
    a = write(tmp_path / "a.tsv", lines)
    opts = PreprocessOptions(progress=False, test_fraction=0.0)
    from hetgmp.data.delimited import DelimitedSource, criteo_spec

    da = preprocess(DelimitedSource([a], criteo_spec()), tmp_path / "A", opts)
    vocab = Vocabulary.load(tmp_path / "A")
    c1, c2 = vocab.fields[0], vocab.fields[1]
    assert c1.rare_id is None and c1.missing_id is None
    assert c1.unseen_id == c1.cardinality - 1
    assert c2.rare_id is None and c2.missing_id is not None and c2.unseen_id == c2.missing_id
    ids = vocab.encode_values("C2", ["ffffffff", ""])
    assert ids.tolist() == [c2.offset + c2.missing_id] * 2
    assert vocab.encode_values("C1", ["ffffffff"]).tolist() == [c1.offset + c1.cardinality - 1]
    assert da.meta.source["reserve_rare_id"] is False


def test_libsvm_and_parquet_roundtrip(tmp_path):
    a = tmp_path / "a.libfm"
    a.write_text("1 0:5:1 1:7:1 2:0:0.5\n0 0:6:1 1:7:1 2:0:1.5\n1 0:5:1 2:0:2\n")
    b = tmp_path / "b.libfm"
    b.write_text("0 0:6:1 1:9:1 2:0:3\n1 0:99:1 1:7:1 2:0:1\n")
    opts = PreprocessOptions(progress=False, test_fraction=0.0, reserve_rare_id=True)
    da = preprocess(LibsvmSource([a], dense_fields=[2]), tmp_path / "A", opts)
    vocab_opts = PreprocessOptions(progress=False, test_fraction=0.0, vocab_from=tmp_path / "A")
    db = preprocess(LibsvmSource([b], num_fields=3, dense_fields=[2]), tmp_path / "B", vocab_opts)
    sa = np.asarray(da.train.sparse)
    f0, f1 = Vocabulary.load(tmp_path / "A").fields
    assert np.asarray(db.train.sparse).tolist() == [
        [sa[1, 0], f1.offset + f1.rare_id], [f0.offset + f0.rare_id, sa[0, 1]]]  # fmt: skip
    table = pa.table(
        {"y": [1, 0, 1], "u": pa.array([3, None, 3], pa.int64()), "c": ["x", "y", "x"]}
    )
    pq.write_table(table, tmp_path / "a.parquet")
    pq.write_table(pa.table({"y": [0, 1], "u": pa.array([None, 4], pa.int64()), "c": ["z", "y"]}),
                   tmp_path / "b.parquet")  # fmt: skip

    def src(name: str) -> ParquetSource:
        return ParquetSource([tmp_path / name], label="y", dense=[], categorical=["u", "c"])

    pa_ds = preprocess(src("a.parquet"), tmp_path / "PA", opts)
    vocab = Vocabulary.load(tmp_path / "PA")
    assert [f.key_scheme for f in vocab.fields] == ["int", "fnv1a64"]
    pb = preprocess(src("b.parquet"), tmp_path / "PB",
                    PreprocessOptions(progress=False, test_fraction=0.0, vocab_from=tmp_path / "PA"))  # fmt: skip
    s = np.asarray(pa_ds.train.sparse)
    u, c = vocab.fields
    assert np.asarray(pb.train.sparse).tolist() == [
        [s[1, 0], c.offset + c.rare_id], [u.offset + u.rare_id, s[1, 1]]]  # fmt: skip
    assert vocab.encode_values("u", [3, None, 4]).tolist() == [
        s[0, 0],
        s[1, 0],
        u.offset + u.rare_id,
    ]


def test_movielens_vocabulary(shared_datasets, tmp_path):
    from hetgmp.data.movielens import convert_movielens

    ds = convert_movielens(shared_datasets / "movielens-100k", tmp_path / "ml", test_fraction=0.0)
    vocab = Vocabulary.load(tmp_path / "ml")
    first = open(shared_datasets / "movielens-100k" / "u.data", encoding="latin-1").readline()
    user = int(first.split("\t")[0])
    assert vocab.encode_values("user", [user]).tolist() == [int(ds.train.sparse[0, 0])]
    gender = vocab.encode_values("gender", ["M", "F", "X"])
    assert sorted(gender[:2].tolist()) == [vocab.fields[3].offset, vocab.fields[3].offset + 1]
    with pytest.raises(VocabError, match="cannot read new raw files"):
        vocab.make_source([tmp_path / "x"])
