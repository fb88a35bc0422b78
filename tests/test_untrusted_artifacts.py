"""Nothing a model artifact or a checkpoint holds runs as code (issue 31, item 1).

The payload: a pickle whose unpickling creates a file (``open(MARKER, "w")``), what an attacker
would swap in for ``os.system``, put where ``torch.export.load`` unpickles it (a weight of
``dense.pt2`` marked as pickled) or in place of a file. Each test shows the payload is live
(``trust_program=True``, or plain unpickling, does create its marker) and that loading never
runs it: the default load reads the dense weights from ``dense.safetensors`` and ignores
``dense.pt2``, a payload in place of the weights is refused naming the file, and recomputing
the manifest's checksums does not help.
"""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from test_ingest_criteo import criteo_lines, write
from test_serve import _arrays, _trained_checkpoint

import hetgmp.serve
from hetgmp.cli import main
from hetgmp.filecheck import file_record
from hetgmp.serve.artifact import MANIFEST, ArtifactError, read_manifest, write_manifest
from hetgmp.serve.export import export_checkpoint
from hetgmp.train.checkpoint import CheckpointError, open_checkpoint


class _Payload:
    """Unpickling this creates the file ``marker`` (builtins.open in write mode)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - pickle's protocol
        return (open, (str(self.marker), "w"))


def _live_payload(tmp_path: Path, marker: Path) -> bytes:
    """The payload's bytes, after checking that unpickling them does run (another marker)."""
    probe = tmp_path / "probe-ran"
    pickle.loads(pickle.dumps(_Payload(probe))).close()
    assert probe.exists()  # the payload is live: unpickling it runs code
    return pickle.dumps(_Payload(marker))


def _craft_program(pt2: Path, marker: Path) -> None:
    """Rewrite the exported program ``pt2`` so that ``torch.export.load`` runs the payload: its
    first weight marked as pickled (``use_pickle``, which torch.export loads with
    ``torch.load(weights_only=False)``) and pointed at the payload."""
    payload = io.BytesIO()
    torch.save(_Payload(marker), payload)
    src = zipfile.ZipFile(io.BytesIO(pt2.read_bytes()))
    with zipfile.ZipFile(pt2, "w", zipfile.ZIP_STORED) as out:
        for name in src.namelist():
            data = src.read(name)
            if name.endswith("model_weights_config.json"):
                cfg = json.loads(data)
                first = next(iter(cfg["config"]))
                cfg["config"][first].update(use_pickle=True, path_name="weight_payload")
                data = json.dumps(cfg).encode()
                out.writestr(name.rsplit("/", 1)[0] + "/weight_payload", payload.getvalue())
            out.writestr(name, data)


def _reseal(root: Path) -> None:
    """Recompute the artifact manifest's file records, as an attacker would."""
    manifest = read_manifest(root)
    manifest.pop("files")
    manifest.pop("format")
    manifest.pop("version")
    write_manifest(root, manifest)


def test_load_reads_safetensors_and_never_unpickles_the_program(tiny_dataset, tmp_path) -> None:
    ck = _trained_checkpoint(tiny_dataset.root, tmp_path)
    model = export_checkpoint(ck, tmp_path / "m")
    ids, dense = _arrays(tiny_dataset.test)
    want = hetgmp.serve.load(model, compile=False).score(ids, dense).numpy()
    # the trusted path (the exported program itself) scores the same: the weights are the same
    trusted = hetgmp.serve.load(model, compile=False, trust_program=True)
    np.testing.assert_allclose(trusted.score(ids, dense).numpy(), want, rtol=0, atol=1e-6)

    marker = tmp_path / "program-ran"
    _craft_program(model / "dense.pt2", marker)
    _reseal(model)
    for compile_ in (False, "auto"):
        got = hetgmp.serve.load(model, compile=compile_).score(ids, dense).numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert not marker.exists()
    # what trust_program=True means: the program is unpickled, and the payload runs
    with pytest.raises(ArtifactError, match=r"dense\.pt2: cannot load the exported program"):
        hetgmp.serve.load(model, trust_program=True)
    assert marker.exists()
    marker.unlink()

    # the payload in place of the weights: refused, naming the file, not run
    (model / "dense.safetensors").write_bytes(pickle.dumps(_Payload(marker)))
    _reseal(model)
    with pytest.raises(ArtifactError, match=r"dense\.safetensors: unreadable safetensors file"):
        hetgmp.serve.load(model)
    assert not marker.exists()


def test_an_artifact_without_safetensors_weights_needs_trust(tiny_dataset, tmp_path) -> None:
    """An artifact of an older hetgmp (only the pickled program) is refused by default, saying
    how to load it; trust_program=True loads it."""
    ck = _trained_checkpoint(tiny_dataset.root, tmp_path)
    model = export_checkpoint(ck, tmp_path / "m")
    (model / "dense.safetensors").unlink()
    _reseal(model)
    with pytest.raises(ArtifactError, match=r"lists no dense\.safetensors.*trust_program=True"):
        hetgmp.serve.load(model)
    ids, dense = _arrays(tiny_dataset.test)
    assert hetgmp.serve.load(model, trust_program=True).score(ids, dense).shape == (len(ids),)
    # weights that do not fit the manifest's model are refused naming the file
    other = export_checkpoint(ck, tmp_path / "m2")
    m = other / MANIFEST
    m.write_text(m.read_text().replace('"model": "wdl"', '"model": "dcn"'))
    with pytest.raises(ArtifactError, match=r"dense\.safetensors: the weights do not fit.*dcn"):
        hetgmp.serve.load(other)


def test_hetgmp_predict_ignores_a_crafted_program(tmp_path) -> None:
    """The real command, in a process of its own, with the payload as dense.pt2."""
    raw = write(tmp_path / "train.tsv", criteo_lines(200, seed=0))
    assert main(["preprocess", "criteo", str(raw), "--out", str(tmp_path / "A"),
                 "--no-progress"]) == 0  # fmt: skip
    ck = _trained_checkpoint(tmp_path / "A", tmp_path)
    model = export_checkpoint(ck, tmp_path / "model")
    marker = tmp_path / "program-ran"
    _craft_program(model / "dense.pt2", marker)
    _reseal(model)
    out = tmp_path / "s.parquet"
    p = subprocess.run(
        [sys.executable, "-m", "hetgmp", "predict", str(model), str(raw), "--out", str(out),
         "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert out.exists() and not marker.exists()


def test_a_checkpoint_file_with_a_pickle_payload_is_refused(tiny_dataset, tmp_path) -> None:
    """Checkpoints are read with torch.load(weights_only=True): a payload in dense.pt (with the
    checkpoint manifest's checksum recomputed) is refused naming the file, by the Python API
    and by `hetgmp export`, and never runs."""
    ck = _trained_checkpoint(tiny_dataset.root, tmp_path)
    step = open_checkpoint(ck).path
    marker = tmp_path / "checkpoint-ran"
    _live_payload(tmp_path, marker)
    torch.save({"model": _Payload(marker)}, step / "dense.pt")
    mpath = step / "manifest.json"
    manifest = json.loads(mpath.read_text())
    manifest["files"]["dense.pt"] = file_record(step / "dense.pt")
    mpath.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"dense\.pt: unreadable checkpoint file"):
        open_checkpoint(ck).dense()
    rc = main(["export", str(ck), "--out", str(tmp_path / "m")])
    assert rc == 2 and not marker.exists()
