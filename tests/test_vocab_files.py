"""Vocabulary files: old directories without them, corrupted or foreign files, the verifier."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from test_ingest_criteo import criteo_lines, write

from hetgmp.cli import main
from hetgmp.data.delimited import DelimitedSource, criteo_spec
from hetgmp.data.format import open_dataset
from hetgmp.data.preprocess import PreprocessOptions, preprocess
from hetgmp.data.verify import describe, verify_dataset
from hetgmp.data.vocab_store import VocabError, Vocabulary


@pytest.fixture
def criteo_dir(tmp_path):
    a = write(tmp_path / "a.tsv", criteo_lines(300))
    opts = PreprocessOptions(progress=False, min_count=2, test_fraction=0.2)
    preprocess(DelimitedSource([a], criteo_spec()), tmp_path / "A", opts)
    return tmp_path / "A"


def test_layout_manifest_and_verify(criteo_dir):
    m = json.loads((criteo_dir / "vocab" / "manifest.json").read_text())
    assert m["format"] == "hetgmp-vocab" and m["vocab_version"] == 1
    assert m["dense"]["transform"] == "log" and m["input"]["reader"] == "delimited"
    assert m["min_count"] == 2 and m["id_order"] == "frequency"
    ds = open_dataset(criteo_dir)
    for e, f in zip(m["fields"], ds.meta.fields, strict=True):
        assert (e["name"], e["offset"], e["cardinality"]) == (f.name, f.offset, f.cardinality)
        keys = np.load(criteo_dir / "vocab" / e["keys_file"])
        ids = np.load(criteo_dir / "vocab" / e["ids_file"])
        assert keys.dtype == np.uint64 and (np.diff(keys.astype(np.float64)) > 0).all()
        assert ids.dtype == np.int32 and keys.shape == ids.shape == (e["num_keys"],)
        # Stored keys are the kept values only: the rare id is never stored.
        assert e["rare_id"] not in ids.tolist()
    rep = verify_dataset(criteo_dir)
    assert rep.ok, rep.failures
    assert any("vocabulary v1: 26 fields" in line for line in rep.lines)
    assert any(line.startswith("vocabulary   vocab/") for line in describe(ds))


def test_directory_without_vocabulary_still_loads_and_verifies(criteo_dir, tmp_path, capsys):
    shutil.rmtree(criteo_dir / "vocab")  # as written before vocabularies were saved
    ds = open_dataset(criteo_dir)
    assert ds.meta.splits == {"train": 240, "test": 60}
    rep = verify_dataset(criteo_dir)
    assert rep.ok, rep.failures
    assert any("vocabulary: absent" in line for line in rep.lines)
    assert main(["dataset", "verify", str(criteo_dir)]) == 0
    manifest = criteo_dir / "vocab" / "manifest.json"
    with pytest.raises(VocabError, match=f"{manifest}: no vocabulary in"):
        Vocabulary.load(criteo_dir)
    b = write(tmp_path / "b.tsv", criteo_lines(20, seed=5))
    capsys.readouterr()
    rc = main(["preprocess", "criteo", str(b), "--out", str(tmp_path / "B"), "--no-progress",
               "--vocab-from", str(criteo_dir)])  # fmt: skip
    assert rc == 2 and f"{manifest}: no vocabulary" in capsys.readouterr().err
    assert not (tmp_path / "B").exists()


def _corrupt_bytes(path):
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF  # a key / id byte, not the header
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage,load_error,verify_error", [
    ("truncate", "not a readable .npy file", "not a readable .npy file"),
    ("unsorted", "keys not strictly increasing", "keys not strictly increasing"),
    ("flip", None, "sha256 differs"),
    ("ids_range", "ids outside", "ids outside"),
    ("dup_ids", "two keys share one id", "two keys share one id"),
    ("missing", "vocabulary file is missing", "vocabulary file is missing"),
    ("wrong_dtype", "expected uint64", "expected uint64"),
])  # fmt: skip
def test_corrupted_vocab_file_is_named(criteo_dir, damage, load_error, verify_error):
    m = json.loads((criteo_dir / "vocab" / "manifest.json").read_text())
    e = next(e for e in m["fields"] if e["num_keys"] > 3 and e["rare_id"] is not None)
    keys_path = criteo_dir / "vocab" / e["keys_file"]
    ids_path = criteo_dir / "vocab" / e["ids_file"]
    bad = keys_path
    if damage == "truncate":
        keys_path.write_bytes(keys_path.read_bytes()[:70])
    elif damage == "unsorted":
        np.save(keys_path, np.load(keys_path)[::-1].copy())
    elif damage == "flip":
        _corrupt_bytes(keys_path)
        keys = np.load(keys_path)
        np.save(keys_path, np.sort(keys))  # still sorted: only the checksum can tell
    elif damage == "ids_range":
        ids = np.load(ids_path)
        ids[1] = e["cardinality"] + 5
        np.save(ids_path, ids)
        bad = ids_path
    elif damage == "dup_ids":
        ids = np.load(ids_path)
        ids[1] = ids[0]
        np.save(ids_path, ids)
        bad = ids_path
    elif damage == "missing":
        keys_path.unlink()
    else:
        np.save(keys_path, np.load(keys_path).astype(np.float64))
    if load_error is None:
        Vocabulary.load(criteo_dir)  # cheap checks pass; the verifier reads the checksums
    else:
        with pytest.raises(VocabError, match=f"{bad}: .*{load_error}"):
            Vocabulary.load(criteo_dir)
    rep = verify_dataset(criteo_dir)
    assert not rep.ok
    assert any(str(bad) in f and verify_error in f for f in rep.failures), rep.failures
    # The data arrays themselves are still fine.
    assert open_dataset(criteo_dir).meta.splits == {"train": 240, "test": 60}


@pytest.mark.parametrize("text,error", [
    ("{not json", "not valid JSON"),
    ('{"format": "something-else", "vocab_version": 1}', "format is 'something-else'"),
    ('{"format": "hetgmp-vocab", "vocab_version": 99, "fields": []}', "vocab_version 99 is newer"),
    ('{"format": "hetgmp-vocab", "vocab_version": 1, "fields": [{"name": "C1"}]}', "field 0 lacks"),
])  # fmt: skip
def test_foreign_or_bad_manifest_is_named(criteo_dir, text, error):
    manifest = criteo_dir / "vocab" / "manifest.json"
    manifest.write_text(text)
    with pytest.raises(VocabError, match=f"{manifest}: {error}"):
        Vocabulary.load(criteo_dir)
    rep = verify_dataset(criteo_dir)
    assert any(str(manifest) in f and error in f for f in rep.failures), rep.failures


def test_manifest_disagreeing_with_meta_is_reported(criteo_dir):
    manifest = criteo_dir / "vocab" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["fields"][3]["cardinality"] += 1
    manifest.write_text(json.dumps(m))
    rep = verify_dataset(criteo_dir)
    assert any(str(manifest) in f and "differ from meta.json" in f for f in rep.failures)


def test_encode_rejects_raw_values_as_keys(criteo_dir):
    vocab = Vocabulary.load(criteo_dir)
    with pytest.raises(TypeError, match="encode_values"):
        vocab.encode("C1", np.array([1, 2]))
    with pytest.raises(KeyError, match="no field 'nope'"):
        vocab.encode_values("nope", ["1"])
    with pytest.raises(ValueError, match="field C3: 'xyz' is not a hex value"):
        vocab.encode_values("C3", ["xyz"])
