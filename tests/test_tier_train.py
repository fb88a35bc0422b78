"""Training with rows in host memory (``--rows-on host``, hetgmp/embedding/tiered.py) through
the trainer: batches made resident a step ahead (the trainer reads one batch ahead and tells
the table) train bit for bit like the all-on-device table; the tier's counters reach the TRAIN
lines and the results JSON, its sizes the memory plan; checkpoints hold the true rows, resume
continues exactly, and export equals the all-on-device run's."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from hetgmp.comm.env import DistEnv
from hetgmp.config import validate
from hetgmp.data.format import make_fields, write_dataset
from hetgmp.embedding import tier_setup
from hetgmp.serve.artifact import ROWS
from hetgmp.serve.export import export_checkpoint
from hetgmp.train.checkpoint import open_checkpoint
from hetgmp.train.config import TrainConfig
from hetgmp.train.run import train

CARDS = [200, 500, 300]  # 1000 rows: a 15 % cache holds 150, a batch of 16 uses <= 48


def write_skewed(
    root: Path, cards: list[int], *, seed: int, power: int, n_train: int, n_test: int
) -> Path:
    """A data set of hot and cold ids (a power of a uniform: a Zipf-like head, steeper with
    ``power``), so a cache hits and misses; three fields of ``cards`` ids, two dense features."""
    rng = np.random.default_rng(seed)
    fields = make_fields(["a", "b", "c"], cards)
    offs = np.array([f.offset for f in fields])

    def split(n: int):
        local = np.stack([(rng.random(n) ** power * c).astype(np.int64) for c in cards], axis=1)
        dense = rng.random((n, 2), dtype=np.float32)
        return local + offs, dense, (rng.random(n) < 0.3).astype(np.float32)

    write_dataset(root, fields, {"train": split(n_train), "test": split(n_test)}, num_dense=2)
    return root


@pytest.fixture
def skewed(tmp_path: Path) -> Path:
    """Hot and cold ids (a cube of a uniform), so the cache hits and misses."""
    return write_skewed(tmp_path / "skewed", CARDS, seed=3, power=3, n_train=480, n_test=96)


def run(root: Path, **kw: object) -> tuple[dict, str]:
    """One training run in this process; its results and console output."""
    base = dict(
        dataset=str(root),
        batch_size=16,
        eval_batch_size=16,
        embed_dim=4,
        iter=20,
        log_every=10,
        progress=False,
        threads=1,
        lr=0.05,
        dense_optimizer="adam",
    )
    out = io.StringIO()
    env = DistEnv.single(device=torch.device(str(kw.get("device", "cpu"))))
    res = train(validate(TrainConfig(**{**base, **kw})), env, stream=out)
    return res, out.getvalue()


def test_tier_counters_in_results_log_and_memory_plan(
    skewed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the host-decided tier's counters: read ahead, evictions; several ranks use it)
    monkeypatch.setattr(tier_setup, "DEVICE_TIER", False)
    base, _ = run(skewed)
    res, text = run(skewed, rows_on="host", cache_budget=0.15, output=tmp_path / "r.json")
    # the ahead path (every batch told a step early) trains exactly as the device table
    assert res["val_auc"] == base["val_auc"] and res["val_loss"] == base["val_loss"]
    t = json.loads((tmp_path / "r.json").read_text())["host_tier"]
    assert t["steps"] == 20 and t["cache_rows"] == 150 and t["table_rows"] == 1000
    assert t["misses"] > 0 and t["hits"] > 0 and t["evictions"] > 0 and t["written_back"] > 0
    assert t["hit_rate"] == t["hits"] / (t["hits"] + t["misses"])
    row_bytes = 4 * (4 + 1)  # dim 4 + Adagrad's state
    assert t["bytes_h2d_per_step"] == t["misses"] * row_bytes / 20
    assert t["ahead"] >= 15 and t["ahead"] + t["ahead_skipped"] <= 20
    assert t["host_bytes"] == 1000 * row_bytes and t["device_bytes"] == 150 * row_bytes
    train_lines = [ln for ln in text.splitlines() if ln.startswith("TRAIN ")]
    assert len(train_lines) == 2 and all("tier_hit " in ln for ln in train_lines)
    assert all("tier_h2d_per_step " in ln and "tier_evictions " in ln for ln in train_lines)
    assert "rank 0 host tier: device cache 150 of 1,000 rows (15.0 %)" in text
    assert "host memory 0.0 MiB (every row and its state)" in text
    # the start-up's phases, one parseable line each, in order (hetgmp.embedding.tier_host)
    phases = re.findall(r"^host tier setup: (\w+)((?: \w+ \d+)*) elapsed_s (\d+\.\d\d)$",
                        text, re.M)  # fmt: skip
    assert [p[0] for p in phases] == ["count", "init", "host", "cache"]
    assert dict(zip(*[iter(phases[1][1].split())] * 2, strict=True)) == {
        "rows": "1000", "bytes": str(1000 * row_bytes)}  # fmt: skip


def checkpoint_rows(ckdir: Path) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """A checkpoint's dense layers, and its rows and optimizer state in id order."""
    ck = open_checkpoint(ckdir)
    emb = ck.embedding_union()
    order = torch.argsort(emb["ids"])
    return ck.dense()["model"], emb["weight"][order], emb["opt_state"][order]


def _same(a: tuple, b: tuple) -> None:
    assert set(a[0]) == set(b[0]) and all(torch.equal(a[0][k], b[0][k]) for k in a[0])
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])


def test_checkpoint_resume_and_export_with_host_rows(skewed: Path, tmp_path: Path) -> None:
    tier = dict(rows_on="host", cache_budget=0.15, val=False)
    dev, straight, halves = (tmp_path / n for n in ("dev", "straight", "halves"))
    run(skewed, checkpoint_dir=dev, checkpoint_every=10, val=False)
    run(skewed, checkpoint_dir=straight, **tier)
    run(skewed, iter=10, checkpoint_dir=halves, **tier)
    # a checkpoint mid-run holds the true rows (the cache's updated rows written back first)
    _same(checkpoint_rows(halves / "step-00000010"), checkpoint_rows(dev / "step-00000010"))
    run(skewed, checkpoint_dir=halves, resume=True, **tier)
    assert open_checkpoint(halves).position.step == 20
    _same(
        checkpoint_rows(halves), checkpoint_rows(straight)
    )  # resume == uninterrupted, bit for bit
    _same(checkpoint_rows(straight), checkpoint_rows(dev))  # == the all-on-device run
    assert not torch.equal(checkpoint_rows(halves / "step-00000010")[1], checkpoint_rows(halves)[1])
    arts = [export_checkpoint(ck, tmp_path / f"art-{ck.name}") for ck in (dev, halves)]
    a, b = (load_file(str(p / ROWS)) for p in arts)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)  # bound 0
