"""Serving a model trained on multi-hot fields (issue 34): `hetgmp export` records the fields and
their pooling (artifact version 2), `hetgmp predict` reads raw CSV / parquet / libfm rows with
bags, encodes every bag value through the vocabulary and pools as training did.

The anchor: a model trained by the CLI, exported, scores raw rows exactly as the training code's
own evaluation (``score_split`` over the restored model) scores the same rows preprocessed with
``--vocab-from``, for sum and mean pooling, empty bags and unknown values included. Real files,
the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import hetgmp.serve
import hetgmp.serve.artifact as artifact
from hetgmp.cli import main as cli_main
from hetgmp.comm.env import DistEnv
from hetgmp.data.dataset_reader import SplitArrays
from hetgmp.data.format import open_dataset
from hetgmp.data.multi_hot_padded import padded_ids
from hetgmp.data.vocab_store import Vocabulary
from hetgmp.serve.artifact import ArtifactError
from hetgmp.serve.export import ExportOptions, export_checkpoint
from hetgmp.train.checkpoint import open_checkpoint
from hetgmp.train.config import TrainConfig
from hetgmp.train.evaluate import score_split
from hetgmp.train.run import build_trainer, distributed_embedding
from hetgmp.train.runlog import RunLog

HEADER = "label,user,x,tags,genres"


def _rows(n: int, seed: int) -> list[str]:
    """Rows whose label is planted on the tags (t0..t4 make a click likely); bags of 0-5 tags
    (';') and 0-3 genres ('|'), repeats included; one value in ten is seen once (rare)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        tags = [f"t{int(v)}" for v in rng.integers(0, 20, rng.integers(0, 6))]
        genres = [f"g{int(v)}" for v in rng.integers(0, 6, rng.integers(0, 4))]
        hot = any(int(t[1:]) < 5 for t in tags)
        y = int(hot ^ (rng.random() < 0.1))
        user = f"u{int(rng.integers(0, 15))}" if rng.random() > 0.1 else f"u{seed}0{i}"
        tags += [f"t{seed}0{i}"] if rng.random() < 0.1 else []
        genres += [f"g{seed}0{i}"] if rng.random() < 0.1 else []
        out.append(f"{y},{user},{rng.random():.3f},{';'.join(tags)},{'|'.join(genres)}")
    return out


def _csv(path: Path, rows: list[str]) -> Path:
    path.write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    return path


def _preprocess(src: Path, out: Path, *extra: str) -> None:
    assert cli_main(["preprocess", "csv", str(src), "--label", "label", "--dense", "x",
                     "--categorical", "user", "--multi-hot", "tags:;", "--multi-hot", "genres",
                     "--test-fraction", "0", "--out", str(out), "--no-progress",
                     *extra]) == 0  # fmt: skip


def _train_cli(ds: Path, ck: Path, pooling: str, *extra: str) -> None:
    assert cli_main(["train", "--dataset", str(ds), "--device", "cpu", "--epochs", "2",
                     "--batch-size", "64", "--embed-dim", "4", "--pooling", pooling,
                     "--threads", "1", "--no-val", "--checkpoint-dir", str(ck),
                     "--no-progress", *extra]) == 0  # fmt: skip


def _trained_scores(
    train_ds: Path, ck: Path, pooling: str, scored: Path, *, embed_dim: object = 4,
    model: str = "wdl",
) -> np.ndarray:  # fmt: skip
    """The trained model's own evaluation scores (training's model code, restored from the
    checkpoint ``ck``) of data set ``scored``'s train split (encoded with train_ds's vocabulary)."""
    cfg = TrainConfig(dataset=str(train_ds), device="cpu", embed_dim=embed_dim, batch_size=64,
                      pooling=pooling, progress=False, val=False, threads=1,
                      model=model)  # fmt: skip
    env = DistEnv.single()
    trainer = build_trainer(cfg, env, RunLog(active=False), distributed_embedding)
    trainer.restore(open_checkpoint(ck))
    split = open_dataset(scored).train
    widths = trainer.dataset.widths  # (the new rows' bags fit the training widths)
    padded = SplitArrays(padded_ids(split, widths), split.dense, split.labels, [])
    probs, _ = score_split(trainer.model, padded, env, batch_size=16)
    return probs.numpy()


def _new_rows() -> list[str]:
    """Fresh rows, then an empty bag in both fields, unknown values everywhere, repeats."""
    return [*_rows(40, seed=7), "1,u3,0.5,,", "0,nobody,0.25,zz1;t1;zz2,g9", "1,u1,0.1,t2;t2;t2,g1"]


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_predict_raw_multi_hot_rows_scores_as_the_trained_model(
    tmp_path: Path, pooling: str, capsys
) -> None:
    src = _csv(tmp_path / "train.csv", _rows(300, seed=0))
    _preprocess(src, tmp_path / "A", "--min-count", "2")  # (rare values: a rare id per field)
    _train_cli(tmp_path / "A", tmp_path / "ck", pooling)
    assert cli_main(["export", str(tmp_path / "ck"), "--out", str(tmp_path / "m")]) == 0
    assert f"multi-hot fields tags ({pooling}), genres ({pooling})" in capsys.readouterr().out
    m = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert m["version"] == 2 and m["num_fields"] == 1
    assert [(f["name"], f["pooling"]) for f in m["multi_hot"]] == [
        ("tags", pooling), ("genres", pooling)
    ]  # fmt: skip
    assert m["program"]["inputs"]["rows"][1] == 3  # (user + one pooled row per bag field)
    new = _csv(tmp_path / "new.csv", _new_rows())
    _preprocess(new, tmp_path / "B", "--vocab-from", str(tmp_path / "A"))
    want = _trained_scores(tmp_path / "A", tmp_path / "ck", pooling, tmp_path / "B")
    out = tmp_path / "s.parquet"
    assert cli_main(["predict", str(tmp_path / "m"), str(new), "--out", str(out),
                     "--no-progress", "--batch-size", "16"]) == 0  # fmt: skip
    t = pq.read_table(out).to_pydict()
    assert t["line"] == list(range(2, 2 + len(_new_rows())))
    np.testing.assert_allclose(t["score"], want, rtol=0, atol=1e-6)
    # the special rows: empty bags; unknown values (the rare ids) next to a known one
    b = open_dataset(tmp_path / "B").train
    tags, genres = b.multi_hot
    assert tags.lengths()[-3] == 0 and genres.lengths()[-3] == 0
    vocab = Vocabulary.load(tmp_path / "A")
    rare = [f.offset + f.rare_id for f in vocab.fields]
    unknown = tags.values[tags.offsets[-3] : tags.offsets[-2]].tolist()
    assert unknown[0] == unknown[2] == rare[1] != unknown[1]
    assert genres.values[genres.offsets[-3]] == rare[2] and b.sparse[-2, 0] == rare[0]
    # the vocabulary's own stream gives every list value the id preprocessing gave it
    (block,) = vocab.encode_files([new])
    for (values, offsets), mh in zip(block.lists, b.multi_hot, strict=True):
        assert values.tolist() == mh.values.tolist() and offsets.tolist() == mh.offsets.tolist()
    # rows without their label column (--label no): the bag columns move with the others
    bare = tmp_path / "bare.csv"
    bare.write_text("\n".join(r.split(",", 1)[1] for r in new.read_text().splitlines()) + "\n")
    assert cli_main(["predict", str(tmp_path / "m"), str(bare), "--out", str(out), "--label",
                     "no", "--no-progress"]) == 0  # fmt: skip
    np.testing.assert_allclose(pq.read_table(out)["score"].to_numpy(), want, rtol=0, atol=1e-6)
    # the Python API: raw values (a list per sample for the bags) score the same
    scorer = hetgmp.serve.load(tmp_path / "m")
    raw = {"user": ["u3", "nobody"], "tags": [[], ["zz1", "t1", "zz2"]], "genres": [None, ["g9"]]}
    got = scorer.score_raw(raw, [[0.5], [0.25]]).numpy()
    np.testing.assert_allclose(got, want[-3:-1], rtol=0, atol=1e-6)


def test_multi_hot_artifact_refusals_and_bad_input(tmp_path: Path, capsys, monkeypatch) -> None:
    src = _csv(tmp_path / "train.csv", _rows(200, seed=1))
    _preprocess(src, tmp_path / "A")
    _train_cli(tmp_path / "A", tmp_path / "ck", "sum,mean")
    model = export_checkpoint(tmp_path / "ck", tmp_path / "m")
    m = json.loads((model / "manifest.json").read_text())
    assert [f["pooling"] for f in m["multi_hot"]] == ["sum", "mean"]
    # a malformed line stops predict with its file and line; nothing is written
    rows = _rows(5, seed=2)
    rows[2] = "1,u1,0.5,t1;;t2,g1"
    new = _csv(tmp_path / "new.csv", rows)
    out = tmp_path / "s.parquet"
    assert cli_main(["predict", str(model), str(new), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{new}:line 4: column tags: 't1;;t2'" in err and "Traceback" not in err
    assert not out.exists()
    rows[2] = "1,u1,notanumber,t1,g1"
    _csv(new, rows)
    assert cli_main(["predict", str(model), str(new), "--out", str(out), "--no-progress"]) == 2
    assert f"{new}:line 4: column x" in capsys.readouterr().err
    # the Python API names what is wrong with bags
    scorer = hetgmp.serve.load(model)
    ids, dense = torch.zeros(2, 1, dtype=torch.int64), torch.zeros(2, 1)
    with pytest.raises(ValueError, match=r"multi-hot fields \(tags, genres\): pass bags="):
        scorer.score(ids, dense)
    tags_lo = m["multi_hot"][0]["offset"]
    genre = m["multi_hot"][1]["offset"]
    with pytest.raises(ValueError, match=r"field tags: offsets has 2 entries, expected 3"):
        scorer.score(ids, dense, bags=[([tags_lo], [0, 1]), ([genre], [0, 1, 1])])
    with pytest.raises(ValueError, match=r"field genres: offsets must not decrease"):
        scorer.score(ids, dense, bags=[([tags_lo], [0, 1, 1]), ([genre], [0, 2, 1])])
    with pytest.raises(ValueError, match=rf"field genres: id {tags_lo} is outside its range"):
        scorer.score(ids, dense, bags=[([tags_lo], [0, 1, 1]), ([tags_lo], [0, 1, 1])])
    with pytest.raises(TypeError, match=r"field tags, sample 1: a bag is a list of values"):
        scorer.score_raw({"user": ["u1", "u2"], "tags": [[], "t1;t2"], "genres": [[], []]})
    # host rows with a small cache, and the dense part compiled (the rows pooled before it)
    vals = {"user": ["u1", "u2", "u3"], "tags": [["t1", "t2"], [], ["t3"] * 4],
            "genres": [["g1"], ["g2", "g3"], []]}  # fmt: skip
    want = scorer.score_raw(vals, [[0.1], [0.2], [0.3]]).numpy()
    for kw in ({"rows": "host", "gpu_cache_rows": 5}, {"compile": True, "warmup": ()}):
        other = hetgmp.serve.load(model, **kw)
        assert other.compiled == ("compile" in kw)
        got = other.score_raw(vals, [[0.1], [0.2], [0.3]]).numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # a hetgmp whose layout stops at version 1 refuses the version-2 artifact by name
    monkeypatch.setattr(artifact, "ARTIFACT_VERSION", 1)
    with pytest.raises(ArtifactError, match=r"artifact version 2 is newer .* upgrade hetgmp"):
        hetgmp.serve.load(model)
    monkeypatch.undo()
    # --min-count counts bag values: a tag seen in training keeps its row
    kept = export_checkpoint(tmp_path / "ck", tmp_path / "k", ExportOptions(min_count=2))
    index = hetgmp.serve.load(kept).index
    t1 = Vocabulary.load(tmp_path / "A").encode_values("tags", ["t1"])[0]
    assert int(index[t1]) != int(index.max())  # (not the zero row: the last row of 'rows')


def _parquet(path: Path, rows: list[str]) -> Path:
    cells = [r.split(",") for r in rows]
    pq.write_table(pa.table({
        "label": pa.array([int(c[0]) for c in cells], pa.int8()),
        "user": pa.array([c[1] for c in cells]),
        "x": pa.array([float(c[2]) for c in cells]),
        "tags": pa.array([c[3].split(";") if c[3] else [] for c in cells], pa.list_(pa.string())),
        "genres": pa.array([c[4].split("|") if c[4] else None for c in cells],
                           pa.list_(pa.string())),
    }), path, row_group_size=64)  # fmt: skip
    return path


def _libfm(path: Path, rows: list[str]) -> Path:
    """Field 0: the user, field 1: the tags (repeated), field 2: x (dense)."""
    lines = []
    for r in rows:
        y, user, x, tags, _ = r.split(",")
        toks = [f"0:{int(user[1:])}:1"] + [f"1:{int(t[1:])}:1" for t in tags.split(";") if t]
        lines.append(" ".join([y, *toks, f"2:1:{x}"]))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("fmt", ["parquet", "libsvm"])
def test_parquet_lists_and_libfm_bags_predict_as_trained(tmp_path: Path, fmt: str) -> None:
    rows = _rows(200, seed=3)
    if fmt == "parquet":
        src = _parquet(tmp_path / "d.parquet", rows)
        args = ["--label", "label", "--dense", "x", "--categorical", "user",
                "--multi-hot", "tags", "--multi-hot", "genres"]  # fmt: skip
    else:
        src = _libfm(tmp_path / "d.libfm", rows)
        args = ["--dense-fields", "2", "--multi-hot-fields", "1"]
    assert cli_main(["preprocess", fmt, str(src), *args, "--test-fraction", "0", "--out",
                     str(tmp_path / "A"), "--no-progress"]) == 0  # fmt: skip
    _train_cli(tmp_path / "A", tmp_path / "ck", "mean")
    export_checkpoint(tmp_path / "ck", tmp_path / "m")
    want = _trained_scores(tmp_path / "A", tmp_path / "ck", "mean", tmp_path / "A")
    out = tmp_path / "s.parquet"
    assert cli_main(["predict", str(tmp_path / "m"), str(src), "--out", str(out),
                     "--no-progress"]) == 0  # fmt: skip
    np.testing.assert_allclose(pq.read_table(out)["score"].to_numpy(), want, rtol=0, atol=1e-6)
