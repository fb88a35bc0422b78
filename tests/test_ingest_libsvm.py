"""Plain libsvm lines (``label index:value``), the field map, mixed forms and -1/+1 labels.

Each plain-libsvm input is checked against the libfm file that states the same fields
explicitly (``label field:id:value``), which the reader already handled (issue 15 item 10).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from hetgmp.cli import main as cli_main
from hetgmp.data.bad_lines import BadInputError
from hetgmp.data.format import Dataset, open_dataset
from hetgmp.data.libsvm import LibsvmSource
from hetgmp.data.preprocess import PreprocessOptions, preprocess

OPTS = PreprocessOptions(progress=False, test_fraction=0.0)
SKIP = PreprocessOptions(progress=False, test_fraction=0.0, on_bad_line="skip")


def _same(a: Dataset, b: Dataset) -> None:
    np.testing.assert_array_equal(a.train.sparse, b.train.sparse)
    np.testing.assert_array_equal(a.train.labels, b.train.labels)
    if b.train.dense is not None:
        np.testing.assert_allclose(a.train.dense, b.train.dense)
    np.testing.assert_array_equal(a.meta.field_cardinalities, b.meta.field_cardinalities)


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_plain_libsvm_token_position_is_the_field(tmp_path):
    rng = np.random.default_rng(0)
    plain, libfm = [], []
    for _ in range(300):
        label = int(rng.random() < 0.4)
        # Criteo-libsvm style: one token per field, field f's indices in their own range
        idx = [int(f * 1000 + rng.zipf(1.6) % 50) for f in range(3)]
        dense = round(float(rng.random()), 3)
        plain.append(f"{label} " + " ".join(f"{i}:1" for i in idx) + f" 9999:{dense}")
        libfm.append(
            f"{label} " + " ".join(f"{f}:{i}:1" for f, i in enumerate(idx)) + f" 3:9999:{dense}"
        )
    a = LibsvmSource([_write(tmp_path / "p.svm", plain)], dense_fields=[3], block_bytes=500)
    assert a.form.kind == "libsvm" and a.num_fields == 4
    b = LibsvmSource([_write(tmp_path / "f.libfm", libfm)], dense_fields=[3])
    _same(preprocess(a, tmp_path / "a", OPTS), preprocess(b, tmp_path / "b", OPTS))


def test_position_form_needs_one_token_per_field(tmp_path):
    path = _write(tmp_path / "p.svm", ["1 1:1 7:1 9:1", "0 2:1 8:1 9:1", "1 3:1 8:1"])
    with pytest.raises(
        BadInputError,
        match=rf"{path}:line 3: 2 features, expected 3: .*"
        "--field-map",
    ):
        preprocess(LibsvmSource([path]), tmp_path / "o", OPTS)
    ds = preprocess(LibsvmSource([path]), tmp_path / "o", SKIP)
    assert ds.meta.splits["train"] == 2
    assert ds.meta.source["bad_lines"]["counts"] == {"wrong_field_count": 1}
    assert ds.meta.source["form"] == "libsvm" and ds.meta.source["fields"] == "token position"


def _one_hot(n: int, seed: int = 1):
    """a9a-like rows: each of 3 fields has a value from its own index range, or is absent."""
    rng = np.random.default_rng(seed)
    ranges = {0: range(1, 6), 1: range(6, 20), 2: range(20, 23)}
    plain, libfm = [], []
    for _ in range(n):
        label = "+1" if rng.random() < 0.5 else "-1"
        present = [(f, int(rng.choice(list(r)))) for f, r in ranges.items() if rng.random() < 0.8]
        present = present or [(0, 1)]
        plain.append(label + " " + " ".join(f"{i}:1" for _, i in present))
        libfm.append(
            ("1" if label == "+1" else "0") + " " + " ".join(f"{f}:{i}:1" for f, i in present)
        )
    fmap = "\n".join(f"{i} {f}" for f, r in ranges.items() for i in r) + "\n"
    return plain, libfm, fmap


def test_field_map_maps_feature_index_to_field(tmp_path, caplog):
    plain, libfm, fmap = _one_hot(400)
    (tmp_path / "map.txt").write_text("# index field\n" + fmap)
    a = LibsvmSource(
        [_write(tmp_path / "p.svm", plain)], field_map=tmp_path / "map.txt", block_bytes=300
    )
    assert a.num_fields == 3
    with caplog.at_level(logging.INFO, logger="hetgmp.data.libsvm"):
        got = preprocess(a, tmp_path / "a", OPTS)
    # -1/+1 labels: stated once, however many blocks carry them
    said = [r.message for r in caplog.records if "-1 is read as 0" in r.message]
    assert said == ["libsvm labels: -1 is read as 0 and +1 as 1"]
    b = LibsvmSource([_write(tmp_path / "f.libfm", libfm)], num_fields=3)
    _same(got, preprocess(b, tmp_path / "b", OPTS))
    assert got.meta.source["fields"] == str(tmp_path / "map.txt")


@pytest.mark.parametrize(
    "bad,expect",
    [
        ("1 2:1 99:1", "feature index 99 is not in --field-map"),
        ("1 2:1 3:1", "field 0 appears twice"),
        ("2 2:1", r"label '2' is not 0/1 \(or libsvm's -1/\+1\)"),
        ("0.5 2:1", "label '0.5' is not 0/1"),
    ],
)
def test_field_map_and_label_errors_name_the_line(tmp_path, bad, expect):
    path = _write(tmp_path / "p.svm", ["1 1:1 7:1", "-1 2:1", bad])
    (tmp_path / "map.txt").write_text("1 0\n2 0\n3 0\n7 1\n")
    with pytest.raises(BadInputError, match=f"{path}:line 3: {expect}"):
        preprocess(LibsvmSource([path], field_map=tmp_path / "map.txt"), tmp_path / "o", OPTS)
    ds = preprocess(LibsvmSource([path], field_map=tmp_path / "map.txt"), tmp_path / "o", SKIP)
    assert ds.train.labels.ravel().tolist() == [1.0, 0.0]


def test_bad_field_map_file(tmp_path):
    path = _write(tmp_path / "p.svm", ["1 1:1"])
    (tmp_path / "m1").write_text("1 0\n2 x\n")
    with pytest.raises(BadInputError, match=r"m1:line 2: expected 'index field'"):
        LibsvmSource([path], field_map=tmp_path / "m1")
    (tmp_path / "m2").write_text("1 0\n1 1\n")
    with pytest.raises(BadInputError, match="feature index 1 is mapped twice"):
        LibsvmSource([path], field_map=tmp_path / "m2")
    libfm = _write(tmp_path / "f.libfm", ["1 0:1:1"])
    with pytest.raises(ValueError, match="--field-map is for plain libsvm lines"):
        LibsvmSource([libfm], field_map=tmp_path / "m1")


def test_a_file_mixing_forms_is_refused_naming_the_line(tmp_path):
    libfm = _write(tmp_path / "f.libfm", ["1 0:1:1 1:2:1", "0 0:3:1", "1 5:1 6:1"])
    with pytest.raises(
        BadInputError,
        match=(
            rf"{libfm}:line 3: token '5:1' is not field:id:value: it is the libsvm form "
            rf"\(index:value\), but this input is libfm \(field:id:value, as {libfm}:line 1"
        ),
    ):
        preprocess(LibsvmSource([libfm], num_fields=2), tmp_path / "o", OPTS)
    plain = _write(tmp_path / "p.svm", ["1 5:1 6:1", "0 7:1 8:1", "0 0:3:1 7:1"])
    with pytest.raises(
        BadInputError,
        match=(
            rf"{plain}:line 3: token '0:3:1' is not index:value: it is the libfm form "
            rf"\(field:id:value\), but this input is libsvm \(index:value, as {plain}:line 1"
        ),
    ):
        preprocess(LibsvmSource([plain]), tmp_path / "o", OPTS)


def test_cli_plain_libsvm_with_test_file_of_the_same_form(tmp_path, capsys):
    train = _write(tmp_path / "train.svm", ["+1 3:1 10:1", "-1 4:1 11:1", "+1 3:1 11:1"])
    test = _write(tmp_path / "test.svm", ["-1 4:1 10:1"])
    out = tmp_path / "ds"
    argv = [
        "preprocess",
        "libsvm",
        str(train),
        "--out",
        str(out),
        "--test-file",
        str(test),
        "--no-progress",
    ]
    assert cli_main(argv) == 0
    ds = open_dataset(out)
    assert ds.train.labels.ravel().tolist() == [1.0, 0.0, 1.0]
    assert ds.test.labels.ravel().tolist() == [0.0]
    libfm_test = _write(tmp_path / "test.libfm", ["0 0:4:1 1:10:1"])
    argv[argv.index(str(test))] = str(libfm_test)
    assert cli_main([*argv, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert f"{libfm_test}:line 1: token '0:4:1' is not index:value" in err


def test_blank_lines_and_extra_spaces(tmp_path):
    """A blank line is an empty line (it was read as a label-0 row with every field missing);
    repeated spaces, a trailing CR or space separate tokens like one space."""
    path = _write(
        tmp_path / "f.libfm", ["1  0:1:1   1:2:1 ", "0\t0:2:1 1:3:1\r", "", "1 0:1:1 1:3:1"]
    )
    with pytest.raises(BadInputError, match=f"{path}:line 3: empty line"):
        preprocess(LibsvmSource([path]), tmp_path / "o", OPTS)
    ds = preprocess(LibsvmSource([path]), tmp_path / "o", SKIP)
    assert ds.meta.source["bad_lines"]["counts"] == {"empty_line": 1}
    assert ds.train.labels.ravel().tolist() == [1.0, 0.0, 1.0]
    assert (ds.train.sparse[:, 1] != ds.train.sparse[0, 1]).sum() == 2
