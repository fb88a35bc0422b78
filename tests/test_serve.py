"""Serving: export a checkpoint, load it, score; predict raw files; refuse bad artifacts.

The anchor: the exported artifact scores the test split exactly as the training model's own
evaluation does, for a checkpoint written by 2 real gloo ranks (its rows are split across two
shards), and ``hetgmp predict`` on raw Criteo lines equals preprocessing them with the same
vocabulary and scoring the ids.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from test_ingest_criteo import criteo_lines, write
from test_train import _cfg, local_factory
from test_vocab_roundtrip import unseen_criteo_lines

import hetgmp.serve
from hetgmp.cli import main
from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.data.format import open_dataset
from hetgmp.serve.artifact import ArtifactError
from hetgmp.serve.compiled import CompileError
from hetgmp.serve.export import ExportOptions, export_checkpoint
from hetgmp.serve.table import apply_min_count
from hetgmp.train.checkpoint import open_checkpoint
from hetgmp.train.evaluate import gather_rows, score_split
from hetgmp.train.run import build_trainer, distributed_embedding, train
from hetgmp.train.runlog import RunLog


def _arrays(split) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.from_numpy(np.array(split.sparse, dtype=np.int64)),
        torch.from_numpy(np.array(split.dense, dtype=np.float32)),
    )


def _train_and_score(env: DistEnv, cfg) -> np.ndarray:
    """Train on this rank, then the model's own evaluation scores of the whole test split."""
    trainer = build_trainer(cfg, env, RunLog(active=False), distributed_embedding)
    trainer.fit()
    probs, labels = score_split(trainer.model, trainer.dataset.test, env, batch_size=32)
    return gather_rows(env, torch.stack([probs, labels]))[0].numpy()


def _train_and_score_each(env: DistEnv, cfgs: list) -> list[np.ndarray]:
    """:func:`_train_and_score` for each config, one after another in one spawn."""
    return [_train_and_score(env, cfg) for cfg in cfgs]


def test_export_of_a_two_rank_checkpoint_scores_as_training_evaluates(
    tiny_dataset, tmp_path
) -> None:
    models = ("wdl", "dlrm")
    cfgs = [
        _cfg(tiny_dataset.root, model=m, iter=6, checkpoint_dir=tmp_path / m, val=False, threads=1)
        for m in models
    ]
    wants = spawn_ranks(_train_and_score_each, 2, cfgs, timeout_s=180)[0]
    for model, want in zip(models, wants, strict=True):
        _export_scores_as(tiny_dataset, tmp_path / model, tmp_path / f"m-{model}", want)


def _export_scores_as(tiny_dataset, ck: Path, out_root: Path, want: np.ndarray) -> None:
    """The exports of the 2-rank checkpoint ``ck`` (fp32, bf16, host rows with a GPU cache)
    score the test split as the training run's own evaluation did (``want``)."""
    manifest = json.loads((ck / "step-00000006" / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    shards = list(open_checkpoint(ck).embedding_shards())  # rank order, disjoint ids
    assert [p.name for p, _ in shards] == ["embedding-0.pt", "embedding-1.pt"]
    a, b = (set(sd["ids"].tolist()) for _, sd in shards)
    assert a and b and not a & b
    ids, dense = _arrays(tiny_dataset.test)
    for dtype, tol in (("fp32", 1e-6), ("bf16", 1e-2)):
        out = export_checkpoint(ck, out_root / dtype, ExportOptions(dtype=dtype))
        scorer = hetgmp.serve.load(out)
        got = scorer.score(ids, dense).numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=tol)
        assert json.loads((out / "manifest.json").read_text())["checkpoint"]["world_size"] == 2
    # host rows with a small cache of the hottest rows score the same
    cached = hetgmp.serve.load(out, rows="host", gpu_cache_rows=9)
    assert cached.rows.cached_rows == 9
    np.testing.assert_allclose(cached.score(ids, dense).numpy(), want, rtol=0, atol=1e-2)


def _trained_checkpoint(ds_root: Path, tmp_path: Path) -> Path:
    ck = tmp_path / "ck"
    train(
        _cfg(ds_root, iter=4, checkpoint_dir=ck, val=False),
        DistEnv.single(),
        embedding_factory=local_factory,
    )
    return ck


def test_predict_raw_criteo_equals_preprocess_then_model(tmp_path) -> None:
    cli = ["--no-progress", "--min-count", "2"]
    raw = write(tmp_path / "train.tsv", criteo_lines(400, seed=0))
    assert main(["preprocess", "criteo", str(raw), "--out", str(tmp_path / "A"), *cli]) == 0
    ck = _trained_checkpoint(tmp_path / "A", tmp_path)
    assert main(["export", str(ck), "--out", str(tmp_path / "model")]) == 0
    lines = criteo_lines(120, seed=5) + unseen_criteo_lines(60)
    lines.insert(30, "not\ta\tcriteo\tline")
    new = write(tmp_path / "new.tsv", lines)
    assert main(["preprocess", "criteo", str(new), "--out", str(tmp_path / "B"),
                 "--vocab-from", str(tmp_path / "A"), "--test-fraction", "0",
                 "--on-bad-line", "skip", "--no-progress"]) == 0  # fmt: skip
    scorer = hetgmp.serve.load(tmp_path / "model")
    want = scorer.score(*_arrays(open_dataset(tmp_path / "B").train)).numpy()
    out = tmp_path / "scores.parquet"
    assert main(["predict", str(tmp_path / "model"), str(new), "--format", "criteo",
                 "--out", str(out), "--on-bad-line", "skip", "--no-progress",
                 "--batch-size", "50"]) == 0  # fmt: skip
    t = pq.read_table(out).to_pydict()
    assert t["line"] == [k + 1 for k in range(len(lines)) if k != 30]
    assert set(t["file"]) == {str(new)}
    np.testing.assert_allclose(t["score"], want, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(t["label"], [float(x.split("\t")[0]) for x in t_lines(lines)])
    # Criteo's unlabeled test files (39 columns) are detected; no label column is written;
    # the scorer compiled (--compile on) scores as the exported program
    bare = write(tmp_path / "bare.tsv", [x.split("\t", 1)[1] for x in t_lines(lines)])
    assert main(["predict", str(tmp_path / "model"), str(bare), "--out", str(out),
                 "--no-progress", "--compile", "on"]) == 0  # fmt: skip
    t = pq.read_table(out).to_pydict()
    assert "label" not in t
    np.testing.assert_allclose(t["score"], want, rtol=0, atol=1e-5)  # (compiled)
    # score_raw: raw values through the vocabulary
    first = lines[0].split("\t")
    raw_dense = [[float(v) if v else np.nan for v in first[1:14]]]
    cats = {f"C{i + 1}": [first[14 + i]] for i in range(26)}
    np.testing.assert_allclose(scorer.score_raw(cats, raw_dense).numpy(), want[:1], atol=1e-6)


def t_lines(lines: list[str]) -> list[str]:
    """The good lines (the bad one has 4 columns)."""
    return [x for x in lines if x.count("\t") == 39]


def test_predict_bad_line_stops_with_file_and_line(tmp_path, capsys) -> None:
    raw = write(tmp_path / "train.tsv", criteo_lines(200, seed=0))
    assert main(["preprocess", "criteo", str(raw), "--out", str(tmp_path / "A"),
                 "--no-progress"]) == 0  # fmt: skip
    ck = _trained_checkpoint(tmp_path / "A", tmp_path)
    export_checkpoint(ck, tmp_path / "model")
    lines = criteo_lines(20, seed=1)
    lines[7] = lines[7].replace("\t", "\tx", 1)
    new = write(tmp_path / "new.tsv", lines)
    out = tmp_path / "s.parquet"
    rc = main(["predict", str(tmp_path / "model"), str(new), "--out", str(out), "--no-progress"])
    assert rc == 2 and f"{new}:line 8" in capsys.readouterr().err
    assert not out.exists()
    rc = main(["predict", str(tmp_path / "model"), str(new), "--out", str(out), "--format", "csv"])
    assert rc == 2 and "read as criteo, not --format csv" in capsys.readouterr().err


def test_corrupted_missing_and_foreign_artifacts_name_the_file(tiny_dataset, tmp_path) -> None:
    ck = _trained_checkpoint(tiny_dataset.root, tmp_path)
    good = export_checkpoint(ck, tmp_path / "m")
    hetgmp.serve.load(good)
    rows = good / "rows.safetensors"
    data = bytearray(rows.read_bytes())
    data[-3] ^= 0xFF
    rows.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"rows\.safetensors: SHA-256 differs"):
        hetgmp.serve.load(good)
    export_checkpoint(ck, good, ExportOptions(overwrite=True))
    (good / "dense.pt2").unlink()
    with pytest.raises(ArtifactError, match=r"dense\.pt2: missing"):
        hetgmp.serve.load(good)
    export_checkpoint(ck, good, ExportOptions(overwrite=True))
    (good / "config.json").write_text("{}")
    with pytest.raises(ArtifactError, match=r"config\.json: 2 bytes"):
        hetgmp.serve.load(good)
    # a checkpoint is not an artifact; a truncated manifest; a newer version
    with pytest.raises(ArtifactError, match=r"manifest\.json: not a hetgmp serving artifact"):
        hetgmp.serve.load(ck / "step-00000004")
    m = good / "manifest.json"
    text = m.read_text()
    assert json.loads(text)["version"] == 1  # (no multi-hot fields: what older hetgmp reads)
    m.write_text(text[: len(text) // 2])
    with pytest.raises(ArtifactError, match=r"manifest\.json: not valid JSON"):
        hetgmp.serve.load(good)
    m.write_text(text.replace('"version": 1', '"version": 99'))
    with pytest.raises(ArtifactError, match=r"manifest\.json: artifact version 99.*upgrade"):
        hetgmp.serve.load(good)
    with pytest.raises(ArtifactError, match=r"tmp.*exists; pass --overwrite"):
        export_checkpoint(ck, good)


def test_min_count_drops_rows_to_rare_row_or_zero_row(tiny_dataset, tmp_path) -> None:
    table = torch.arange(10, dtype=torch.float32).reshape(5, 2) + 1
    counts = np.array([9, 1, 5, 0, 7])
    fields = [{"offset": 0, "cardinality": 3}, {"offset": 3, "cardinality": 2}]
    rows, index, dropped = apply_min_count(table, counts, 5, fields, [2, None])
    assert dropped == 2 and rows.shape == (4, 2)
    # id 1 -> field 0's rare row (id 2); id 3 (field 1, no rare id) -> the zero row
    assert index.tolist() == [0, 1, 1, 3, 2]
    assert rows[3].abs().sum() == 0
    ck = _trained_checkpoint(tiny_dataset.root, tmp_path)
    out = export_checkpoint(ck, tmp_path / "m", ExportOptions(min_count=40))
    m = json.loads((out / "manifest.json").read_text())
    assert m["rows"]["dropped_rows"] > 0 and m["rows"]["counts"].startswith("training split")
    ids, dense = _arrays(tiny_dataset.test)
    assert hetgmp.serve.load(out).score(ids, dense).shape == (len(ids),)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rows_on_device_and_host_cache_score_as_cpu(tiny_dataset, tmp_path) -> None:
    ck = _trained_checkpoint(tiny_dataset.root, tmp_path)
    out = export_checkpoint(ck, tmp_path / "m")
    ids, dense = _arrays(tiny_dataset.test)
    want = hetgmp.serve.load(out).score(ids, dense).numpy()
    for rows, cache in (("device", None), ("host", 11), ("auto", None)):
        s = hetgmp.serve.load(out, device="cuda", rows=rows, gpu_cache_rows=cache)
        got = s.score(ids, dense).cpu().numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_compiled_scorer_scores_as_the_exported_program(tiny_dataset, tmp_path) -> None:
    """torch.compile of the rebuilt dense part (CPU: inductor's C++ backend), batches padded to
    a bucket and split into chunks of max_batch, scores as the exported program run eagerly."""
    ck = _trained_checkpoint(tiny_dataset.root, tmp_path)
    ids, dense = _arrays(tiny_dataset.test)  # 100 samples: chunks of 64 and 36 (padded to 64)
    for dtype in ("fp32", "bf16"):
        out = export_checkpoint(ck, tmp_path / f"m-{dtype}", ExportOptions(dtype=dtype))
        eager = hetgmp.serve.load(out)  # auto off CUDA: the rebuilt model code, uncompiled
        assert not eager.compiled and eager.fast is not None
        program = hetgmp.serve.load(out, compile=False, trust_program=True)  # the program
        assert program.fast is None
        np.testing.assert_allclose(
            eager.score(ids, dense).numpy(), program.score(ids, dense).numpy(), rtol=0, atol=1e-6
        )
        fast = hetgmp.serve.load(out, compile=True, max_batch=64, warmup=())
        assert fast.compiled and not fast.cuda_graphs
        want = eager.score(ids, dense).numpy()
        got = fast.score(ids, dense)
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-5)
        # ordinary tensors, the caller's to modify in place (not inference-mode tensors)
        assert not got.is_inference() and not eager.logits(ids, dense).is_inference()
        np.testing.assert_allclose(
            fast.logits(ids, dense).numpy(), eager.logits(ids, dense).numpy(), rtol=0, atol=1e-5
        )
    # rows in host memory with a device cache: the gather stays eager, the dense part compiled
    host = hetgmp.serve.load(out, rows="host", gpu_cache_rows=3, compile=True, max_batch=64,
                             warmup=())  # fmt: skip
    assert host.compiled and host.fast.step.table is None
    np.testing.assert_allclose(host.score(ids, dense).numpy(), want, rtol=0, atol=1e-5)
    # the dense part under bf16 autocast (training's --amp), the bf16 rows going in unwidened
    for comp in (False, True):
        amp = hetgmp.serve.load(out, amp=True, compile=comp, max_batch=64, warmup=())
        assert amp.fast.step.amp and amp.compiled == comp
        got = amp.score(ids, dense).numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-2)
        assert np.abs(got - want).max() > 1e-7  # (bf16 arithmetic did run)


def test_compile_refusals_and_a_model_that_does_not_rebuild(tiny_dataset, tmp_path) -> None:
    ck = _trained_checkpoint(tiny_dataset.root, tmp_path)
    out = export_checkpoint(ck, tmp_path / "m")
    with pytest.raises(ValueError, match=r"compile='yes': choose 'auto', True or False"):
        hetgmp.serve.load(out, compile="yes")
    with pytest.raises(ValueError, match=r"cuda_graphs needs a CUDA device"):
        hetgmp.serve.load(out, cuda_graphs=True)
    with pytest.raises(ValueError, match=r"on_compile_error='maybe'"):
        hetgmp.serve.load(out, compile=True, on_compile_error="maybe")
    # a trusted program that is not what this hetgmp's model code builds (here: the manifest
    # names another model) cannot be compiled: an error naming why, or a warning and the
    # exported program, uncompiled (without trust the weights are refused: test_untrusted_*)
    m = out / "manifest.json"
    m.write_text(m.read_text().replace('"model": "wdl"', '"model": "dcn"'))
    with pytest.raises(
        CompileError, match=r"cannot rebuild the dense part: .*dense state does not"
    ):
        hetgmp.serve.load(out, compile=True, trust_program=True)
    with pytest.warns(UserWarning, match=r"cannot rebuild the dense part.*runs as loaded"):
        s = hetgmp.serve.load(out, compile=True, on_compile_error="warn", trust_program=True)
    assert not s.compiled and s.fast is None
    ids, dense = _arrays(tiny_dataset.test)
    want = hetgmp.serve.load(out, compile=False, trust_program=True).score(ids, dense)
    np.testing.assert_allclose(s.score(ids, dense).numpy(), want.numpy(), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cuda_compiled_graphs_score_as_eager(tiny_dataset, tmp_path, dtype) -> None:
    """The default CUDA scorer (compiled, one CUDA graph per bucket) scores as the exported
    program eagerly, over buckets, padding and chunks; a result outlives the next call."""
    ck = _trained_checkpoint(tiny_dataset.root, tmp_path)
    out = export_checkpoint(ck, tmp_path / "m", ExportOptions(dtype=dtype))
    ids, dense = _arrays(tiny_dataset.test)
    eager = hetgmp.serve.load(out, device="cuda", compile=False, cuda_graphs=False)
    fast = hetgmp.serve.load(out, device="cuda", max_batch=64)
    assert fast.compiled and fast.cuda_graphs and eager.fast is None
    first = fast.score(ids[:1], dense[:1])
    for n in (1, 3, 64, 100):  # buckets 1, 4, 64; 100 = chunks 64 + 36
        want = eager.score(ids[:n], dense[:n]).cpu().numpy()
        np.testing.assert_allclose(fast.score(ids[:n], dense[:n]).cpu().numpy(), want, atol=1e-5)
        got = fast.logits(ids[:n], dense[:n]).cpu().numpy()
        np.testing.assert_allclose(got, eager.logits(ids[:n], dense[:n]).cpu().numpy(), atol=1e-5)
    np.testing.assert_allclose(first.cpu().numpy(), want[:1], atol=1e-5)  # not overwritten
    graphs = hetgmp.serve.load(out, device="cuda", compile=False)  # eager layers in graphs
    assert graphs.cuda_graphs and not graphs.compiled
    np.testing.assert_allclose(graphs.score(ids, dense).cpu().numpy(), want, atol=1e-5)
    amp = hetgmp.serve.load(out, device="cuda", amp=True)  # bf16 autocast, compiled, graphs
    assert amp.compiled and amp.cuda_graphs
    np.testing.assert_allclose(amp.score(ids, dense).cpu().numpy(), want, atol=1e-2)


def test_inference_benchmark_quick_cpu_smoke(tmp_path) -> None:
    """``bench/gpu/inference.py --quick --devices cpu``: every contender (the compiled scorer
    included) runs and the report is written (one batch size: each costs compilations)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.gpu.inference import main as bench_main

    argv = ["--quick", "--devices", "cpu", "--batches", "8", "--seconds", "0.05"]
    assert bench_main([*argv, "--out-dir", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "serving_cpu.json").read_text())
    errors = [r for r in res["records"] if "error" in r]
    assert not errors, errors
    names = {r["contender"] for r in res["records"]}
    assert {"hetgmp", "hetgmp+compile", "hetgmp+compile+bf16rows", "hetgmp+compile+amp",
            "torch+compile", "torch+compile+amp"} <= names  # fmt: skip
    assert "autocast on both sides" in (tmp_path / "serving_cpu.md").read_text()
    assert {r["batch"] for r in res["records"]} == {8}
    assert "Best of each side" in (tmp_path / "serving_cpu.md").read_text()
