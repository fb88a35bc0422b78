"""Serving a model trained with a dimension per field (issue 34, ``--embed-dim 4,2,3``):
`hetgmp export` builds the dense part with the checkpoint's ``field_dims`` and records them
(artifact version 3), so the program keeps each field's first ``d_f`` columns of the table's
rows exactly as training's model does; `hetgmp predict` and ``hetgmp.serve.load`` score with it.

The anchor, as in tests/test_serve_multi_hot.py: a model trained by the CLI, exported, scores
raw rows as the training code's own evaluation of the restored checkpoint scores the same rows
preprocessed with ``--vocab-from`` (to 1e-6), single-hot and with multi-hot fields, through the
model code (WDL's inference first layer included) and through the exported program itself.
Real files, the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from test_serve_multi_hot import _csv, _new_rows, _preprocess, _rows, _train_cli, _trained_scores

import hetgmp.serve
import hetgmp.serve.artifact as artifact
from hetgmp.cli import main as cli_main
from hetgmp.comm.env import DistEnv
from hetgmp.data.format import open_dataset
from hetgmp.serve.artifact import ArtifactError
from hetgmp.serve.first_layer import InferenceHead
from hetgmp.train.checkpoint import open_checkpoint
from hetgmp.train.config import TrainConfig
from hetgmp.train.evaluate import score_split
from hetgmp.train.run import build_trainer, distributed_embedding
from hetgmp.train.runlog import RunLog

DIMS = "4,2,3"  # user, tags, genres (single-hot, or tags and genres multi-hot)


def _single_hot(src: Path, out: Path, *extra: str) -> None:
    """Every column a single-hot field (a bag's text as one value)."""
    assert cli_main(["preprocess", "csv", str(src), "--label", "label", "--dense", "x",
                     "--categorical", "user", "tags", "genres", "--test-fraction", "0",
                     "--out", str(out), "--no-progress", *extra]) == 0  # fmt: skip


def _single_hot_scores(train_ds: Path, ck: Path, model: str, scored: Path) -> np.ndarray:
    """The restored checkpoint's own evaluation scores of ``scored``'s train split."""
    cfg = TrainConfig(dataset=str(train_ds), device="cpu", embed_dim=DIMS, batch_size=64,
                      model=model, progress=False, val=False, threads=1)  # fmt: skip
    env = DistEnv.single()
    trainer = build_trainer(cfg, env, RunLog(active=False), distributed_embedding)
    trainer.restore(open_checkpoint(ck))
    assert trainer.model.fields.dims == (4, 2, 3)
    probs, _ = score_split(trainer.model, open_dataset(scored).train, env, batch_size=16)
    return probs.numpy()


def _predict(model_dir: Path, src: Path, out: Path) -> np.ndarray:
    assert cli_main(["predict", str(model_dir), str(src), "--out", str(out), "--no-progress",
                     "--batch-size", "16"]) == 0  # fmt: skip
    return pq.read_table(out)["score"].to_numpy()


@pytest.mark.parametrize("model", ["wdl", "dfm"])
def test_single_hot_per_field_dims_score_as_trained(
    tmp_path: Path, model: str, capsys, monkeypatch
) -> None:
    src = _csv(tmp_path / "train.csv", _rows(300, seed=0))
    _single_hot(src, tmp_path / "A", "--min-count", "2")
    _train_cli(tmp_path / "A", tmp_path / "ck", "sum", "--embed-dim", DIMS, "--model", model)
    assert cli_main(["export", str(tmp_path / "ck"), "--out", str(tmp_path / "m")]) == 0
    assert "field dims 4,2,3" in capsys.readouterr().out
    m = json.loads((tmp_path / "m" / "manifest.json").read_text())
    width = 5 if model == "dfm" else 4  # (DeepFM's first-order column)
    assert (m["version"], m["field_dims"], m["embed_dim"], m["table_dim"]) == (3, [4, 2, 3], 4,
                                                                               width)  # fmt: skip
    assert m["program"]["inputs"]["rows"] == ["batch", 3, width, "float32"] and "multi_hot" not in m
    new = _csv(tmp_path / "new.csv", _new_rows())
    _single_hot(new, tmp_path / "B", "--vocab-from", str(tmp_path / "A"))
    want = _single_hot_scores(tmp_path / "A", tmp_path / "ck", model, tmp_path / "B")
    np.testing.assert_allclose(_predict(tmp_path / "m", new, tmp_path / "s.parquet"), want,
                               rtol=0, atol=1e-6)  # fmt: skip
    b = open_dataset(tmp_path / "B").train
    ids, dense = torch.from_numpy(np.array(b.sparse)), torch.from_numpy(np.array(b.dense))
    scorer = hetgmp.serve.load(tmp_path / "m")  # (CPU default: the model code, uncompiled)
    assert isinstance(scorer.fast.step.dense, InferenceHead) == (model == "wdl")
    np.testing.assert_allclose(scorer.score(ids, dense).numpy(), want, rtol=0, atol=1e-6)
    # the exported program itself (dense.pt2), and the model code rebuilt from its weights
    for kw in ({"compile": False}, {}):
        trusted = hetgmp.serve.load(tmp_path / "m", trust_program=True, **kw)
        np.testing.assert_allclose(trusted.score(ids, dense).numpy(), want, rtol=0, atol=1e-6)
        # (rebuilt: a failure to rebuild would only warn and score with the program itself)
        assert (trusted.fast is not None) == (not kw)
    # a hetgmp that reads up to version 2 refuses it by name (not "weights do not fit")
    monkeypatch.setattr(artifact, "ARTIFACT_VERSION", 2)
    with pytest.raises(ArtifactError, match=r"artifact version 3 is newer .* upgrade hetgmp"):
        hetgmp.serve.load(tmp_path / "m")


@pytest.mark.parametrize(("model", "pooling"), [("wdl", "mean"), ("dlrm", "sum,mean")])
def test_multi_hot_per_field_dims_score_as_trained(
    tmp_path: Path, model: str, pooling: str
) -> None:
    src = _csv(tmp_path / "train.csv", _rows(300, seed=1))
    _preprocess(src, tmp_path / "A", "--min-count", "2")
    _train_cli(tmp_path / "A", tmp_path / "ck", pooling, "--embed-dim", DIMS, "--model", model)
    assert cli_main(["export", str(tmp_path / "ck"), "--out", str(tmp_path / "m")]) == 0
    m = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert (m["version"], m["field_dims"], m["num_fields"]) == (3, [4, 2, 3], 1)
    assert [f["name"] for f in m["multi_hot"]] == ["tags", "genres"]
    new = _csv(tmp_path / "new.csv", _new_rows())
    _preprocess(new, tmp_path / "B", "--vocab-from", str(tmp_path / "A"))
    want = _trained_scores(tmp_path / "A", tmp_path / "ck", pooling, tmp_path / "B",
                           embed_dim=DIMS, model=model)  # fmt: skip
    np.testing.assert_allclose(_predict(tmp_path / "m", new, tmp_path / "s.parquet"), want,
                               rtol=0, atol=1e-6)  # fmt: skip
    raw = {"user": ["u3", "nobody"], "tags": [[], ["zz1", "t1", "zz2"]], "genres": [None, ["g9"]]}
    for kw in ({}, {"rows": "host", "gpu_cache_rows": 5}, {"trust_program": True,
                                                           "compile": False}):  # fmt: skip
        scorer = hetgmp.serve.load(tmp_path / "m", **kw)
        got = scorer.score_raw(raw, [[0.5], [0.25]]).numpy()
        np.testing.assert_allclose(got, want[-3:-1], rtol=0, atol=1e-6)


def test_malformed_field_dims_are_refused_by_name(tmp_path: Path) -> None:
    src = _csv(tmp_path / "train.csv", _rows(120, seed=2))
    _single_hot(src, tmp_path / "A")
    _train_cli(tmp_path / "A", tmp_path / "ck", "sum", "--embed-dim", DIMS, "--epochs", "1")
    assert cli_main(["export", str(tmp_path / "ck"), "--out", str(tmp_path / "m")]) == 0
    path = tmp_path / "m" / "manifest.json"
    good = json.loads(path.read_text())
    for bad, why in (([4, 2], "expected 3 dimensions"), ([4, 2, 9], r"each in \[1, embed_dim = 4")):
        path.write_text(json.dumps({**good, "field_dims": bad}))
        with pytest.raises(ArtifactError, match=rf"{path}: malformed field_dims .*{why}"):
            hetgmp.serve.load(tmp_path / "m", verify=False)
    path.write_text(json.dumps({**good, "version": 1}))  # (field_dims belong to version 3)
    with pytest.raises(ArtifactError, match=r"version 1 with field_dims \(those are version 3"):
        hetgmp.serve.load(tmp_path / "m", verify=False)
