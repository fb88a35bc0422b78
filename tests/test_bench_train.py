"""The training benchmark (bench/gpu/train_gpu.sh) on CPU: the plain-PyTorch contender, its
architecture against hetgmp's models, the report, and the shell script's syntax. No timings."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu import plain_ctr, train_report  # noqa: E402
from bench.gpu.plain_models import PlainCTR  # noqa: E402
from hetgmp.models import build_model  # noqa: E402

KEYS = {"contender", "model", "gpus", "batch", "samples_per_s", "val_auc", "ms_per_step",
        "variant", "iters", "warmup", "embed_dim", "lr", "sparse_opt", "amp", "compile",
        "cuda_graph", "machine", "date", "command", "dense_params"}  # fmt: skip


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hetgmp.data.generate import generate_criteo_like

    out = tmp_path_factory.mktemp("train_bench") / "ds"
    generate_criteo_like(out, num_samples=3000, scale=0.0005, seed=1, progress=False)
    return out


@pytest.mark.parametrize("model", ["wdl", "dcn"])
def test_plain_ctr_writes_one_record_per_variant(dataset: Path, tmp_path: Path, model: str) -> None:
    out = tmp_path / "runs.jsonl"
    argv = ["--dataset", str(dataset), "--model", model, "--batch", "64", "--iters", "6",
            "--warmup", "2", "--embed-dim", "4", "--device", "cpu", "--eval-batch", "500",
            "--variants", "fp32,bf16+adagrad", "--output", str(out)]  # fmt: skip
    assert plain_ctr.main(argv) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["variant"] for r in recs] == ["fp32", "bf16+adagrad"]
    for r in recs:
        assert KEYS <= set(r), KEYS - set(r)
        assert r["contender"] == "plain-pytorch" and r["model"] == model and r["gpus"] == 1
        assert r["batch"] == 64 and r["iters"] == 6 and r["warmup"] == 2
        assert 0.0 <= r["val_auc"] <= 1.0 and math.isfinite(r["train_loss"])
        assert r["samples_per_s"] > 0 and r["ms_per_step"] > 0
        assert r["cuda_graph"] is False  # graphs only on CUDA
    assert recs[1]["sparse_opt"] == "adagrad" and recs[1]["amp"] is True
    assert recs[1]["lr"] == plain_ctr.SPARSE_LR["adagrad"]


def test_plain_ctr_single_variant_flags(dataset: Path, tmp_path: Path) -> None:
    """The flag form (--amp, --sparse-opt adam) gives one record; graphs are skipped on CPU."""
    out = tmp_path / "one.jsonl"
    argv = ["--dataset", str(dataset), "--batch", "128", "--iters", "3", "--warmup", "1",
            "--embed-dim", "4", "--device", "cpu", "--amp", "--cuda-graphs", "--sparse-opt",
            "adam", "--output", str(out)]  # fmt: skip
    assert plain_ctr.main(argv) == 0
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["variant"] == "bf16+graph+adam" and rec["cuda_graph"] is False


def test_variant_parse() -> None:
    v = plain_ctr.Variant.parse("bf16+compile+graph")
    assert (v.amp, v.compile, v.graph, v.opt) == (True, True, True, "sgd")
    assert v.name == "bf16+compile+graph"
    assert plain_ctr.Variant.parse("fp32", "adagrad").name == "fp32+adagrad"
    with pytest.raises(ValueError):
        plain_ctr.Variant.parse("fp16")


@pytest.mark.parametrize("model", ["wdl", "dcn"])
def test_plain_model_has_hetgmps_dense_architecture(model: str) -> None:
    """Same dense parameter shapes as hetgmp's model for the same config: catches drift."""
    fields, dense, dim, rows = 26, 13, 16, 1000
    het = build_model(model, nn.Embedding(rows, dim), num_fields=fields, num_dense=dense,
                      embed_dim=dim)  # fmt: skip
    plain = PlainCTR(model, num_rows=rows, num_fields=fields, num_dense=dense, embed_dim=dim)
    shapes = sorted(tuple(p.shape) for p in het.dense_parameters())
    assert shapes == sorted(tuple(p.shape) for p in plain.dense_parameters())
    n = sum(p.numel() for p in het.dense_parameters())
    assert n == sum(p.numel() for p in plain.dense_parameters())
    assert n == train_report.dense_params(model, fields, dim, dense)
    # same table init scale as hetgmp's --init_scale default (0.01)
    assert float(plain.emb.weight.abs().max()) <= 0.01
    x = torch.randint(0, rows, (5, fields))
    assert plain(x, torch.randn(5, dense)).shape == (5, 1)


def _rec(contender: str, model: str, batch: int, gpus: int, sps: float, auc: float,
         **kw: object) -> dict:  # fmt: skip
    return {"contender": contender, "model": model, "batch": batch, "gpus": gpus,
            "samples_per_s": sps, "val_auc": auc, "ms_per_step": 1e3 * batch * gpus / sps,
            "embed_dim": 128, "machine": "test box", **kw}  # fmt: skip


def test_train_report_markdown(tmp_path: Path) -> None:
    recs = [
        _rec("plain-pytorch", "wdl", 8192, 1, 4e6, 0.76, variant="fp32", sparse_opt="sgd"),
        _rec("plain-pytorch", "wdl", 8192, 1, 8e6, 0.40, variant="bf16+graph", amp=True),
        _rec("plain-pytorch", "wdl", 8192, 1, 2e6, 0.77, variant="fp32+adagrad",
             sparse_opt="adagrad"),
        _rec("hetgmp-cli", "wdl", 8192, 1, 2e6, 0.77, variant="whole table",
             step_ms={"embedding": 1.5, "total": 4.0}),
        _rec("hetgmp-cli", "wdl", 8192, 2, 3e6, 0.775, variant="plan"),
        {"contender": "hetgmp-cli", "model": "dcn", "batch": 65536, "gpus": 2,
         "samples_per_s": None, "val_auc": None, "status": "skipped: out of time"},
    ]  # fmt: skip
    meta = {"num_fields": 26, "num_dense": 13, "dataset": "d", "steps": "150 at 8192"}
    train_report.write_report(recs, tmp_path, meta)
    md = (tmp_path / "train_cli.md").read_text()
    assert json.loads((tmp_path / "train_cli.json").read_text()) == recs
    # the bf16+graph run is fastest but did not train (AUC 0.40): fp32 is the best plain run
    assert "plain best 4.00M/s (fp32" in md
    assert "CLI 1 GPU 2.00M/s = **0.50x** plain best" in md
    assert "CLI 2 GPUs / 1 GPU = **1.50x**" in md
    assert "plain with adagrad" in md and "skipped: out of time" in md
    assert "| 1.500 |" in md  # the per-phase table
    assert "+0.0100" in md  # the CLI's AUC - plain best
    assert "0.7750" in train_report.short_table(recs)


def test_step_floor() -> None:
    f = train_report.step_floor("wdl", 8192, 26, 128, 13, amp=False)
    assert f["embedding_bytes"] == 8192 * 26 * 128 * 4 * 3
    assert f["embedding_ms"] == pytest.approx(1e3 * f["embedding_bytes"] / 4.8e12)
    params = train_report.dense_params("wdl", 26, 128, 13)
    assert f["mlp_flops"] == 2 * params * 8192 * 3
    bf16 = train_report.step_floor("wdl", 8192, 26, 128, 13, amp=True)
    assert bf16["mlp_ms"] == pytest.approx(f["mlp_ms"] / 2)


def test_cli_record() -> None:
    a = argparse.Namespace(model="wdl", batch=8192, gpus=2, iters=150, wall_s=30.0, rc=0,
                           command="c", machine="m", variant="plan")  # fmt: skip
    res = {"speed": 4e6, "val_auc": 0.77, "step_ms": {"total": 4.1},
           "embedding_train": {"bytes_per_sample": 12.5}, "config": {"amp": False}}  # fmt: skip
    r = train_report.cli_record(res, a)
    assert r["samples_per_s"] == 4e6 and r["step_ms"] == {"total": 4.1} and r["status"] == "ok"
    assert r["global_batch"] == 16384 and r["ms_per_step"] == pytest.approx(4.096)
    assert r["bytes_per_sample"] == 12.5
    failed = train_report.cli_record(None, a)
    assert failed["samples_per_s"] is None and failed["status"].startswith("failed")


def test_train_gpu_sh_parses() -> None:
    subprocess.run(["bash", "-n", str(ROOT / "bench/gpu/train_gpu.sh")], check=True)
