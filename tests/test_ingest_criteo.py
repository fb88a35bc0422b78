"""Criteo TSV ingestion against a plain-Python reference; bad lines; atomic output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ingest_reference import criteo_reference

from hetgmp.cli import main
from hetgmp.data.bad_lines import BadInputError
from hetgmp.data.delimited import DelimitedSource, criteo_spec
from hetgmp.data.format import open_dataset
from hetgmp.data.preprocess import PreprocessOptions, preprocess


def criteo_lines(n: int, seed: int = 0) -> list[str]:
    """Criteo-format lines with empty fields, negative ints and skewed repeated categories."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        label = str(int(rng.random() < 0.3))
        ints = ["" if rng.random() < 0.2 else str(int(rng.integers(-3, 500))) for _ in range(13)]
        cats = []
        for f in range(26):
            if rng.random() < 0.15:
                cats.append("")
            else:
                card = 3 + 5 * f
                cats.append(f"{int(rng.zipf(1.5)) % card * 7919 + f:08x}")
        out.append("\t".join([label, *ints, *cats]))
    return out


def write(path: Path, lines: list[str], end: str = "\n") -> Path:
    path.write_text("\n".join(lines) + end)
    return path


def run(paths, out, block_bytes=1 << 20, **kw):
    src = DelimitedSource(list(paths), criteo_spec(), block_bytes=block_bytes)
    return preprocess(src, out, PreprocessOptions(progress=False, **kw))


@pytest.mark.parametrize("block_bytes", [700, 1 << 20])
@pytest.mark.parametrize("id_order,min_count", [("frequency", 1), ("frequency", 3),
                                                ("first-appearance", 2)])
def test_criteo_matches_reference(tmp_path, block_bytes, id_order, min_count):
    lines = criteo_lines(300)
    f = write(tmp_path / "day.tsv", lines)
    ds = run([f], tmp_path / "out", block_bytes, id_order=id_order, min_count=min_count,
             test_fraction=0.25)
    train, test, cards = criteo_reference(lines, min_count, id_order, 0.25)
    assert [fi.cardinality for fi in ds.meta.fields] == cards
    for split, (sp, de, lb) in (("train", train), ("test", test)):
        arr = ds.split(split)
        np.testing.assert_array_equal(arr.sparse, sp)
        np.testing.assert_allclose(arr.dense, de, rtol=1e-6)
        np.testing.assert_array_equal(arr.labels.ravel(), lb)
    # Contiguous ids: every id of every field is used, and fields are laid out back to back.
    allids = np.concatenate([ds.train.sparse, ds.test.sparse])
    for k, fi in enumerate(ds.meta.fields):
        assert set(np.unique(allids[:, k])) == set(range(fi.offset, fi.offset + fi.cardinality))


def test_threshold_rare_id_missing_and_dense(tmp_path):
    def line(label, i1, c1):
        return "\t".join([label, i1, *[""] * 12, c1, *["a"] * 25])

    rows = [line("1", "-5", "ff"), line("0", "", "ff"), line("0", "7", ""), line("1", "0", "ee"),
            line("0", "3", "dd"), line("0", "3", "")]
    ds = run([write(tmp_path / "t.tsv", rows)], tmp_path / "o", min_count=2, test_fraction=0.0)
    c1 = ds.meta.fields[0]
    # ff x2 and missing x2 kept (tie broken by key: 0xff < missing), ee/dd -> shared rare id 2.
    assert c1.cardinality == 3
    np.testing.assert_array_equal(ds.train.sparse[:, 0], [0, 0, 1, 2, 2, 1])
    assert ds.meta.source["rare_local_id"][0] == 2
    assert ds.meta.source["missing_local_id"][0] == 1
    # Negative and missing integers are both clipped to 0 -> log(2); 7 -> log(9).
    np.testing.assert_allclose(ds.train.dense[:, 0], np.log([2, 2, 9, 2, 5, 5]), rtol=1e-6)
    assert ds.meta.fields[1].offset == 3 and ds.meta.num_embeddings == 3 + 25


def test_multiple_files_and_test_file_split(tmp_path):
    a, b, t = criteo_lines(50, 1), criteo_lines(70, 2), criteo_lines(30, 3)
    src = DelimitedSource([write(tmp_path / "a", a), write(tmp_path / "b", b, end="")],
                          criteo_spec(), block_bytes=200)
    test = DelimitedSource([write(tmp_path / "t", t)], criteo_spec(), block_bytes=200)
    ds = preprocess(src, tmp_path / "o", PreprocessOptions(progress=False), test_source=test)
    train_ref, _, cards = criteo_reference(a + b + t, 1, "frequency", 0.0)
    assert ds.meta.splits == {"train": 120, "test": 30}
    np.testing.assert_array_equal(ds.train.sparse, train_ref[0][:120])
    np.testing.assert_array_equal(ds.test.sparse, train_ref[0][120:])
    assert [fi.cardinality for fi in ds.meta.fields] == cards


def test_random_split_is_deterministic_and_partitions(tmp_path):
    f = write(tmp_path / "d", criteo_lines(400))
    d1 = run([f], tmp_path / "o1", split="random", test_fraction=0.3, seed=5)
    d2 = run([f], tmp_path / "o2", block_bytes=300, split="random", test_fraction=0.3, seed=5)
    assert d1.fingerprint == d2.fingerprint
    assert d1.meta.splits["train"] + d1.meta.splits["test"] == 400
    assert 60 < d1.meta.splits["test"] < 180


BAD_CASES = [
    ("missing field", lambda s: s[: s.rfind("\t")], "39 fields, expected 40"),
    ("extra field", lambda s: s + "\tx", "41 fields, expected 40"),
    ("non-number", lambda s: s.split("\t", 2)[0] + "\t" + "1x\t" + s.split("\t", 2)[2], "I1"),
    ("label", lambda s: "2" + s[1:], "not a 0/1 label"),
    ("empty", lambda s: "", "empty line"),
    ("bad hex", lambda s: s[: s.rfind("\t")] + "\tzz12", "C26"),
]


@pytest.mark.parametrize("name,mutate,expect", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_line_error_names_file_and_line(tmp_path, name, mutate, expect):
    lines = criteo_lines(40)
    lines[22] = mutate(lines[22])
    f = write(tmp_path / "bad.tsv", lines)
    out = tmp_path / "out"
    with pytest.raises(BadInputError) as err:
        run([f], out, block_bytes=256)
    assert f"{f}:line 23:" in str(err.value) and expect in str(err.value)
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_skip_mode_counts_bad_lines(tmp_path):
    lines = criteo_lines(100)
    bad_at = {5: BAD_CASES[0][1], 17: BAD_CASES[2][1], 40: BAD_CASES[3][1], 41: BAD_CASES[4][1],
              90: BAD_CASES[5][1]}
    for i, m in bad_at.items():
        lines[i] = m(lines[i])
    f = write(tmp_path / "d.tsv", lines)
    ds = run([f], tmp_path / "o", block_bytes=512, on_bad_line="skip", test_fraction=0.0)
    rep = ds.meta.source["bad_lines"]
    assert rep["skipped"] == 5
    assert rep["counts"] == {"wrong_field_count": 1, "bad_number": 1, "bad_label": 1,
                             "empty_line": 1, "bad_category": 1}
    assert any(f"{f}:line 18:" in e for e in rep["examples"])
    good = [ln for i, ln in enumerate(lines) if i not in bad_at]
    ref, _, _ = criteo_reference(good, 1, "frequency", 0.0)
    np.testing.assert_array_equal(ds.train.sparse, ref[0])


def test_empty_file_and_only_bad_lines(tmp_path):
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    with pytest.raises(BadInputError, match=f"{empty}:line 1: file is empty"):
        run([empty], tmp_path / "o")
    allbad = write(tmp_path / "bad.tsv", ["1\t2", "x"])
    with pytest.raises(BadInputError, match="no valid data rows"):
        run([allbad], tmp_path / "o", on_bad_line="skip")
    assert not (tmp_path / "o").exists()


def test_failure_while_writing_leaves_no_output(tmp_path, monkeypatch):
    from hetgmp.data.format import DatasetWriter

    real_append = DatasetWriter.append
    calls = []

    def failing_append(self, *a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk vanished")
        return real_append(self, *a, **kw)

    monkeypatch.setattr(DatasetWriter, "append", failing_append)
    f = write(tmp_path / "d", criteo_lines(300))
    src = DelimitedSource([f], criteo_spec(), block_bytes=1000)
    with pytest.raises(OSError, match="disk vanished"):
        preprocess(src, tmp_path / "out", PreprocessOptions(progress=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no output, no temp or spill


def test_failure_while_reading_leaves_no_output(tmp_path):
    class Failing(DelimitedSource):
        def iter_blocks(self, report, progress=None):
            for i, block in enumerate(super().iter_blocks(report, progress)):
                if i == 2:
                    raise OSError("input vanished")
                yield block

    f = write(tmp_path / "d", criteo_lines(300))
    with pytest.raises(OSError, match="input vanished"):
        preprocess(Failing([f], criteo_spec(), block_bytes=1000), tmp_path / "out",
                   PreprocessOptions(progress=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_cli_reports_bad_line_cleanly(tmp_path, capsys):
    lines = criteo_lines(10)
    lines[3] = "1\t2"
    f = write(tmp_path / "d", lines)
    rc = main(["preprocess", "criteo", str(f), "--out", str(tmp_path / "o"), "--no-progress"])
    assert rc == 2
    assert f"{f}:line 4: 2 fields, expected 40" in capsys.readouterr().err
    rc = main(["preprocess", "criteo", str(f), "--out", str(tmp_path / "o"), "--no-progress",
               "--on-bad-line", "skip", "--test-fraction", "0"])
    assert rc == 0
    assert open_dataset(tmp_path / "o").meta.splits == {"train": 9, "test": 0}


def test_fast_path_is_taken_and_equals_general_path(tmp_path, monkeypatch):
    lines = criteo_lines(400, 7)
    lines[5] = "\t".join(["1", *["-7"] * 13, *["DEADBEEF"] * 26])  # upper-case hex, negatives
    f = write(tmp_path / "d.tsv", lines)
    taken = []
    real = DelimitedSource._fast_block

    def spy(self, *a):
        out = real(self, *a)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(DelimitedSource, "_fast_block", spy)
    fast = run([f], tmp_path / "fast", block_bytes=4096, test_fraction=0.2)
    assert taken and all(taken)
    general_src = DelimitedSource([f], criteo_spec(), block_bytes=4096)
    general_src._fast_ok = False
    general = preprocess(general_src, tmp_path / "general",
                         PreprocessOptions(progress=False, test_fraction=0.2))
    assert fast.fingerprint == general.fingerprint


@pytest.mark.parametrize("value", [" 5", "5 ", "0x10", "+5", "1.5"])
def test_fast_path_keeps_strict_integers(tmp_path, value):
    lines = criteo_lines(30)
    parts = lines[9].split("\t")
    parts[3] = value
    lines[9] = "\t".join(parts)
    f = write(tmp_path / "d.tsv", lines)
    with pytest.raises(BadInputError, match=f"{f}:line 10: column I3"):
        run([f], tmp_path / "o")
