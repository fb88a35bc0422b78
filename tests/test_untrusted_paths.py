"""A manifest names no file outside its directory (item 9), and the small things of item 10 of
issue 31: the artifact's file modes, ``predict --out`` into a missing directory, a garbage plan.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from test_ingest_criteo import criteo_lines, write
from test_serve import _trained_checkpoint

from hetgmp.cli import main
from hetgmp.data.vocab_store import VocabError, Vocabulary
from hetgmp.partition.plan import PlanError, load_plan
from hetgmp.serve.artifact import ArtifactError
from hetgmp.serve.export import export_checkpoint
from hetgmp.serve.scorer import load


@pytest.fixture
def criteo_dir(tmp_path: Path) -> Path:
    raw = write(tmp_path / "train.tsv", criteo_lines(200, seed=0))
    assert main(["preprocess", "criteo", str(raw), "--out", str(tmp_path / "A"),
                 "--no-progress"]) == 0  # fmt: skip
    return tmp_path / "A"


def _point(manifest: Path, key: str, value: str) -> None:
    m = json.loads(manifest.read_text())
    m["fields"][0][key] = value
    manifest.write_text(json.dumps(m))


@pytest.mark.parametrize("where", ["../../outside.npy", "/tmp/outside.npy", "link"])
def test_vocab_manifest_naming_a_file_outside_is_refused(criteo_dir, tmp_path, where) -> None:
    vocab = criteo_dir / "vocab"
    manifest = vocab / "manifest.json"
    first = json.loads(manifest.read_text())["fields"][0]
    # a real vocabulary file outside the directory: following the name would succeed
    outside = tmp_path / "outside.npy"
    outside.write_bytes((vocab / first["keys_file"]).read_bytes())
    if where == "link":
        (vocab / "link").symlink_to(outside)
    elif where.startswith("/"):
        where = str(outside)
    _point(manifest, "keys_file", where)
    with pytest.raises(VocabError, match=rf"{manifest}: field .*keys_file.*outside"):
        Vocabulary.load(criteo_dir)
    assert main(["dataset", "verify", str(criteo_dir)]) != 0


def test_artifact_manifest_naming_a_file_outside_is_refused(criteo_dir, tmp_path) -> None:
    model = export_checkpoint(_trained_checkpoint(criteo_dir, tmp_path), tmp_path / "m")
    mpath = model / "manifest.json"
    m = json.loads(mpath.read_text())
    m["files"]["../ck/latest"] = {"bytes": 1, "sha256": "0" * 64}
    mpath.write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=r"'\.\./ck/latest' points outside"):
        load(model)


def test_export_file_modes_follow_the_umask(criteo_dir, tmp_path) -> None:
    ck = _trained_checkpoint(criteo_dir, tmp_path)
    for mask in (0o022, 0o027):
        old = os.umask(mask)
        try:
            model = export_checkpoint(ck, tmp_path / f"m{mask:o}")
        finally:
            os.umask(old)
        modes = {p.relative_to(model).as_posix(): stat.S_IMODE(p.stat().st_mode)
                 for p in model.rglob("*") if p.is_file()}  # fmt: skip
        assert "rows.safetensors" in modes and "dense.safetensors" in modes
        assert set(modes.values()) == {0o666 & ~mask}, modes


def test_predict_out_into_a_missing_directory_is_refused(criteo_dir, tmp_path, capsys) -> None:
    model = export_checkpoint(_trained_checkpoint(criteo_dir, tmp_path), tmp_path / "m")
    out = tmp_path / "no" / "such" / "s.parquet"
    capsys.readouterr()
    rc = main(["predict", str(model), str(tmp_path / "train.tsv"), "--out", str(out),
               "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and f"directory {out.parent} does not exist" in err, err
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("content", [b"garbage, not a plan\n" * 10, b"\x93NUMPY garbage"])
def test_a_garbage_plan_is_named_without_numpy_advice(tmp_path, content) -> None:
    plan = tmp_path / "plan.npz"
    plan.write_bytes(content)
    with pytest.raises(PlanError, match=rf"{plan}: not a plan file") as err:
        load_plan(plan)
    assert "allow_pickle" not in str(err.value)


def test_a_plan_holding_object_arrays_is_named_without_numpy_advice(tmp_path) -> None:
    plan = tmp_path / "plan.npz"
    objs = np.array([{"a": 1}], dtype=object)
    np.savez(plan, data_partition=objs, embed_partition=np.zeros(3, np.int32))
    with pytest.raises(PlanError, match=rf"{plan}: .*object arrays") as err:
        load_plan(plan)
    assert "allow_pickle" not in str(err.value)


@pytest.mark.parametrize(("key", "value"), [("cardinality", "5"), ("offset", None),
                                            ("num_keys", 1.5), ("cardinality", 10**15)])  # fmt: skip
def test_vocab_manifest_numbers_are_checked(criteo_dir, key, value) -> None:
    # a string cardinality raised TypeError (a traceback) comparing the special ids with it,
    # and a huge one made `dataset verify` allocate a byte per id of it
    manifest = criteo_dir / "vocab" / "manifest.json"
    _point(manifest, key, value)
    with pytest.raises(VocabError, match=rf"{manifest}: field .*{key}"):
        Vocabulary.load(criteo_dir)
    assert main(["dataset", "verify", str(criteo_dir)]) != 0
