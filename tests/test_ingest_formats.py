"""CSV / libsvm / parquet ingestion and the shared key + vocabulary code vs plain Python."""

from __future__ import annotations

import csv
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ingest_reference import MISSING, encode_fields

from hetgmp.data.bad_lines import BadInputError
from hetgmp.data.delimited import DelimitedSource, resolve_columns
from hetgmp.data.libsvm import LibsvmSource
from hetgmp.data.parquet_reader import ParquetSource
from hetgmp.data.preprocess import PreprocessOptions, preprocess
from hetgmp.data.vocab import KeyCounter, fnv1a_reference, hex_keys, int_keys, string_keys

OPTS = PreprocessOptions(progress=False, test_fraction=0.0)


def test_hex_keys_general_and_fast_paths():
    vals = ["00ff", "", "a", "ABCDEF12", "123456789abcdef", "0123456789abcdef0", "xyz", "7"]
    keys, invalid = hex_keys(pa.array(vals))
    assert invalid.tolist() == [False, False, False, False, False, True, True, False]
    expect = [0xFF, MISSING, 0xA, 0xABCDEF12, 0x123456789ABCDEF, MISSING, MISSING, 7]
    assert keys.tolist() == expect
    eight = ["deadbeef", "", "0000000a", "ffffffff"]
    assert hex_keys(pa.array(eight))[0].tolist() == [0xDEADBEEF, MISSING, 10, 0xFFFFFFFF]
    sliced = pa.array(["zz", "00000001", "", "00000002"]).slice(1)
    assert hex_keys(sliced)[0].tolist() == [1, MISSING, 2]


def test_string_keys_match_reference_fnv1a():
    vals = ["a", "", "hello world", "ünïcode", "a" * 70, None]
    keys = string_keys(pa.array(vals))
    assert keys.tolist() == [fnv1a_reference((v or "").encode()) for v in vals]
    assert len(set(int_keys(np.arange(-50, 50)).tolist())) == 100


def test_key_counter_merges_like_counter():
    rng = np.random.default_rng(1)
    blocks = [rng.integers(0, 300, size=(int(rng.integers(1, 50)), 2)).astype(np.uint64)
              for _ in range(80)]
    c = KeyCounter(2, track_first=True)
    for b in blocks:
        c.add(b)
    allrows = np.concatenate(blocks)
    for f in range(2):
        keys, counts, first = c.field(f)
        ref = Counter(allrows[:, f].tolist())
        assert dict(zip(keys.tolist(), counts.tolist(), strict=True)) == dict(ref)
        firsts = {k: int(np.flatnonzero(allrows[:, f] == k)[0]) for k in ref}
        assert dict(zip(keys.tolist(), first.tolist(), strict=True)) == firsts


def _csv_rows(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        rows.append({
            "click": str(int(rng.random() < 0.4)),
            "price": "" if rng.random() < 0.1 else f"{rng.normal() * 10:.3f}",
            "site": rng.choice(["news", "shop", "", "sport", "blog x"]),
            "ad": f"ad{int(rng.zipf(1.6)) % 40}",
        })
    return rows


@pytest.mark.parametrize("block_bytes", [150, 1 << 20])
def test_csv_with_header_matches_reference(tmp_path, block_bytes):
    rows = _csv_rows(300)
    path = tmp_path / "log.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["click", "price", "site", "ad"], lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    spec = resolve_columns(path, label="click", dense=["price"], categorical=["site", "3"],
                           delimiter=",", header=True, quote_char=None)
    ds = preprocess(DelimitedSource([path], spec, block_bytes=block_bytes), tmp_path / "o",
                    PreprocessOptions(progress=False, test_fraction=0.0, min_count=2))
    keys = [[fnv1a_reference(r["site"].encode()), fnv1a_reference(r["ad"].encode())] for r in rows]
    ids, cards = encode_fields(keys, 2, "frequency")
    np.testing.assert_array_equal(ds.train.sparse, ids)
    assert [f.cardinality for f in ds.meta.fields] == cards
    assert [f.name for f in ds.meta.fields] == ["site", "ad"]
    dense = [float(r["price"]) if r["price"] else 0.0 for r in rows]
    np.testing.assert_allclose(ds.train.dense.ravel(), dense, rtol=1e-6)
    np.testing.assert_array_equal(ds.train.labels.ravel(), [float(r["click"]) for r in rows])


def test_csv_bad_lines_count_header(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("y,a,b\n1,2,c\n0,oops,d\n1,3,e\n")
    spec = resolve_columns(path, label="y", dense=["a"], categorical=["b"], delimiter=",",
                           header=True, quote_char=None)
    with pytest.raises(BadInputError, match=f"{path}:line 3: column a: 'oops' is not a number"):
        preprocess(DelimitedSource([path], spec), tmp_path / "o", OPTS)
    with pytest.raises(ValueError, match="--categorical 'zz': no such column"):
        resolve_columns(path, label="y", dense=[], categorical=["zz"], delimiter=",",
                        header=True, quote_char=None)


def _libsvm_lines(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lines, rows = [], []
    for _ in range(n):
        present = {f: int(rng.zipf(1.5)) % 20 for f in range(4) if rng.random() < 0.85}
        dense = round(float(rng.random()), 4)
        toks = [f"{f}:{i}:1" for f, i in present.items()] + [f"4:0:{dense}"]
        rng.shuffle(toks)
        label = int(rng.random() < 0.5)
        lines.append(f"{label} " + " ".join(toks))
        rows.append((label, [present.get(f) for f in range(4)], dense))
    return lines, rows


def test_libsvm_matches_reference(tmp_path):
    lines, rows = _libsvm_lines(250)
    path = tmp_path / "d.libfm"
    path.write_text("\n".join(lines) + "\n")
    src = LibsvmSource([path], dense_fields=[4], block_bytes=300)
    assert src.num_fields == 5
    ds = preprocess(src, tmp_path / "o", OPTS)
    keys = [[int(int_keys(np.array([v]))[0]) if v is not None else MISSING for v in ids]
            for _, ids, _ in rows]
    ids, cards = encode_fields(keys, 1, "frequency")
    np.testing.assert_array_equal(ds.train.sparse, ids)
    np.testing.assert_allclose(ds.train.dense.ravel(), [d for _, _, d in rows], rtol=1e-6)
    np.testing.assert_array_equal(ds.train.labels.ravel(), [lb for lb, _, _ in rows])


@pytest.mark.parametrize("bad,expect", [
    ("2 0:1:1", "label '2' is not 0/1"),
    ("1 0:1", "token '0:1' is not field:id:value"),
    ("1 0:1:1 0:2:1", "field 0 appears twice"),
    ("1 9:1:1", "field 9 is outside"),
])
def test_libsvm_bad_lines(tmp_path, bad, expect):
    path = tmp_path / "d.libfm"
    path.write_text("1 0:1:1 1:2:1\n0 1:3:1\n" + bad + "\n")
    with pytest.raises(BadInputError, match=f"{path}:line 3: {expect}"):
        preprocess(LibsvmSource([path], num_fields=2), tmp_path / "o", OPTS)
    ds = preprocess(LibsvmSource([path], num_fields=2), tmp_path / "o",
                    PreprocessOptions(progress=False, test_fraction=0.0, on_bad_line="skip"))
    assert ds.meta.splits["train"] == 2 and ds.meta.source["bad_lines"]["skipped"] == 1


def test_parquet_row_groups_match_reference(tmp_path):
    rng = np.random.default_rng(3)
    n = 500
    table = pa.table({
        "y": pa.array((rng.random(n) < 0.3).astype(np.int64)),
        "x": pa.array(np.where(rng.random(n) < 0.1, np.nan, rng.random(n))).cast(pa.float64()),
        "user": pa.array([None if i % 17 == 0 else int(v) for i, v in
                          enumerate(rng.integers(0, 30, n))], pa.int64()),
        "city": pa.array([["a", "b", "c", None][int(v)] for v in rng.integers(0, 4, n)]),
    })
    path = tmp_path / "d.parquet"
    pq.write_table(table, path, row_group_size=64)
    src = ParquetSource([path], label="y", dense=["x"], categorical=["user", "city"],
                        batch_rows=50)
    # NaN is not a number: those rows are skipped and counted.
    ds = preprocess(src, tmp_path / "o",
                    PreprocessOptions(progress=False, test_fraction=0.0, on_bad_line="skip"))
    d = table.to_pydict()
    keep = [i for i in range(n) if not np.isnan(d["x"][i])]
    assert ds.meta.source["bad_lines"]["counts"] == {"bad_number": n - len(keep)}
    keys = [[int(int_keys(np.array([d["user"][i]]))[0]) if d["user"][i] is not None else MISSING,
             fnv1a_reference((d["city"][i] or "").encode())] for i in keep]
    ids, cards = encode_fields(keys, 1, "frequency")
    np.testing.assert_array_equal(ds.train.sparse, ids)
    np.testing.assert_allclose(ds.train.dense.ravel(), [d["x"][i] for i in keep], rtol=1e-6)
    np.testing.assert_array_equal(ds.train.labels.ravel(), [d["y"][i] for i in keep])
    first_bad = min(set(range(n)) - set(keep)) + 1
    with pytest.raises(BadInputError, match=f"d.parquet:row {first_bad}: column x: nan is not"):
        preprocess(src, tmp_path / "o2", OPTS)


def test_hex8_keys_matches_hex_keys():
    from hetgmp.data.vocab import hex8_keys

    vals = [b"deadbeef", None, b"0000000a", b"FFFFFFFF", None, b"12345678"]
    arr = pa.array(vals, pa.binary(8))
    expect = hex_keys(pa.array([v.decode() if v else "" for v in vals]))[0]
    assert hex8_keys(arr).tolist() == expect.tolist()
    assert hex8_keys(arr.slice(2)).tolist() == expect[2:].tolist()
    assert hex8_keys(pa.array([b"0000000g"], pa.binary(8))) is None
