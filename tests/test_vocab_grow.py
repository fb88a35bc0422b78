"""``hetgmp preprocess ... --vocab-from DIR --grow-vocab`` (issue 32): new values of the new data
get new ids appended per field, every old value keeps its local id, the special ids stay."""

from __future__ import annotations

import numpy as np
from test_vocab_roundtrip import CLI, _csv, _csv_rows, all_ids, raw_to_id

from hetgmp.cli import main
from hetgmp.data.format import open_dataset
from hetgmp.data.vocab_store import Vocabulary

SPEC = ["--label", "click", "--dense", "price", "--categorical", "site", "ad",
        "--dense-transform", "log"]  # fmt: skip


def _local(ds, ids: np.ndarray) -> np.ndarray:
    return ids - np.array([f.offset for f in ds.meta.fields])[None, :]


def test_grow_appends_new_values_and_keeps_old_ids(tmp_path, capsys) -> None:
    first = _csv_rows(300, 0, ["news", "shop", "", "sport"])
    new_sites = ["never seen", "other"]
    second = first[:40] + _csv_rows(200, 1, ["news", *new_sites, "", "shop"])
    a, b = _csv(tmp_path / "a.csv", first), _csv(tmp_path / "b.csv", second)
    assert main(["preprocess", "csv", str(a), *SPEC, "--out", str(tmp_path / "A"),
                 "--reserve-rare-id", *CLI]) == 0  # fmt: skip
    assert main(["preprocess", "csv", str(b), *SPEC, "--out", str(tmp_path / "B"),
                 "--vocab-from", str(tmp_path / "A"), "--grow-vocab", *CLI]) == 0  # fmt: skip
    da, db = open_dataset(tmp_path / "A"), open_dataset(tmp_path / "B")
    va, vb = Vocabulary.load(tmp_path / "A"), Vocabulary.load(tmp_path / "B")
    rows_a = [[r["site"], r["ad"]] for r in first]
    rows_b = [[r["site"], r["ad"]] for r in second]
    local_a = raw_to_id(rows_a, _local(da, all_ids(da)))
    local_b = raw_to_id(rows_b, _local(db, all_ids(db)))  # (one id per value: no sharing)
    for f in range(2):
        old = {v: i for v, i in local_b[f].items() if v in local_a[f]}
        new = {v: i for v, i in local_b[f].items() if v not in local_a[f]}
        assert old == {v: local_a[f][v] for v in old}, f  # old values keep their local ids
        card_a = da.meta.fields[f].cardinality
        assert sorted(new.values()) == list(range(card_a, card_a + len(new))), f  # appended
        assert db.meta.fields[f].cardinality == card_a + len(new)
        # the special ids stay: a value still unknown takes the same unseen (rare) id
        assert (vb.fields[f].rare_id, vb.fields[f].unseen_id) == (
            va.fields[f].rare_id, va.fields[f].unseen_id)  # fmt: skip
    assert set(new_sites) <= {v for v in local_b[0] if v not in local_a[0]}
    # fields are still laid out one after another; the manifest says where they came from
    assert db.meta.fields[1].offset == db.meta.fields[0].cardinality
    grown = vb.manifest["grown_from"]
    assert grown["num_embeddings"] == da.meta.num_embeddings
    assert [(g["name"], g["offset"], g["cardinality"]) for g in grown["fields"]] == [
        (f.name, f.offset, f.cardinality) for f in da.meta.fields]  # fmt: skip
    assert db.meta.source["grown_from"]["new_ids"] == grown["new_ids"]
    assert vb.encode_values("site", ["never seen"])[0] == db.meta.fields[0].offset + new_ids_of(
        local_b[0], local_a[0], "never seen"
    )
    capsys.readouterr()
    assert main(["dataset", "verify", str(tmp_path / "B")]) == 0  # (ids, checksums, layout)
    # a third day grows day 2's vocabulary again; day 2's ids stay
    third = _csv_rows(100, 2, ["news", "third day", "other"])
    c = _csv(tmp_path / "c.csv", third)
    assert main(["preprocess", "csv", str(c), *SPEC, "--out", str(tmp_path / "C"),
                 "--vocab-from", str(tmp_path / "B"), "--grow-vocab", *CLI]) == 0  # fmt: skip
    vc = Vocabulary.load(tmp_path / "C")
    assert vc.encode("site", vb.fields[0].keys, local=True).tolist() == vb.fields[0].ids.tolist()
    assert vc.manifest["grown_from"]["num_embeddings"] == db.meta.num_embeddings


def new_ids_of(b: dict[str, int], a: dict[str, int], value: str) -> int:
    assert value not in a
    return b[value]


def test_grow_needs_vocab_from(tmp_path, capsys) -> None:
    a = _csv(tmp_path / "a.csv", _csv_rows(20, 0, ["x"]))
    assert main(["preprocess", "csv", str(a), *SPEC, "--out", str(tmp_path / "A"),
                 "--grow-vocab", *CLI]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--grow-vocab grows the vocabulary of --vocab-from" in err and "Traceback" not in err
