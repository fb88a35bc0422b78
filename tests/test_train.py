"""Trainer, evaluation, logging and the CLI on a single process and on spawned gloo ranks.

``LocalEmbedding`` below is a deliberately plain full table (every rank holds all rows, no
communication) that follows the embedding contract (gradient applied at the next forward,
``flush``/``state_dict``/``load_state_dict``/``counters``); it lets these tests check the
trainer's own logic independently of the distributed table, which ``test_train_dist.py`` covers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.config import ConfigError, validate
from hetgmp.metrics import roc_auc
from hetgmp.models import build_model
from hetgmp.train.config import TrainConfig
from hetgmp.train.evaluate import evaluate
from hetgmp.train.run import train


class LocalEmbedding(nn.Module):
    """Full table, plain SGD, gradient applied at the next forward (the contract's timing)."""

    def __init__(self, num_rows: int, dim: int, *, lr: float, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("weight", (torch.rand(num_rows, dim, generator=g) - 0.5) * 0.02)
        self.lr = lr
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.reads = 0

    def flush(self) -> None:
        for ids, grad in self._pending:
            self.weight.index_add_(0, ids.reshape(-1), -self.lr * grad.reshape(-1, grad.shape[-1]))
        self._pending.clear()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.flush()
        self.reads += ids.numel()
        rows = self.weight[ids]
        if self.training and torch.is_grad_enabled():
            rows.requires_grad_(True)
            rows.register_hook(lambda g: self._pending.append((ids, g.detach())))
        return rows

    def counters(self) -> dict[str, float]:
        return {"rows_local": float(self.reads)}

    def state_dict(self, *args, **kwargs):  # noqa: ANN002, ANN003
        ids = torch.arange(self.weight.shape[0])
        return {"ids": ids, "weight": self.weight.clone(), "opt_state": torch.zeros(0)}

    def load_state_dict(self, sd, strict: bool = True):  # noqa: ANN001, ARG002
        self.weight[sd["ids"]] = sd["weight"]


def local_factory(cfg, env, num_rows, dim, plan):  # noqa: ANN001, ARG001
    return LocalEmbedding(num_rows, dim, lr=cfg.lr, seed=cfg.seed)


def _cfg(ds_root: Path, **kw) -> TrainConfig:
    base = dict(
        dataset=str(ds_root),
        batch_size=64,
        embed_dim=4,
        log_every=3,
        progress=False,
        lr=0.05,
        warmup_steps=2,
    )
    base.update(kw)
    return validate(TrainConfig(**base))


def test_single_process_training_logs_and_learns(tiny_dataset, tmp_path, capsys) -> None:
    log = tmp_path / "log.jsonl"
    out = tmp_path / "res.json"
    res = train(
        _cfg(tiny_dataset.root, epochs=2, log_json=log, output=out),
        DistEnv.single(),
        embedding_factory=local_factory,
    )
    assert res["step"] == 2 * 7  # 400 samples / 64 per step, twice
    text = capsys.readouterr().out
    train_lines = re.findall(
        r"^TRAIN (\d+): loss (\S+) acc (\S+) time (\S+) speed (\S+)", text, re.M
    )
    assert [int(s) for s, *_ in train_lines] == [3, 6, 9, 12, 14]
    assert all(float(sp) > 0 for *_, sp in train_lines)
    assert re.search(r"^EVAL 14: val_loss \S+ val_acc \S+ val_auc \S+", text, re.M)
    assert "hash placement" in text
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [r["kind"] for r in recs]
    assert kinds[0] == "config" and "train" in kinds and "eval" in kinds and kinds[-1] == "result"
    assert recs[0]["config"]["batch_size"] == 64
    saved = json.loads(out.read_text())
    assert saved["val_auc"] == res["val_auc"] and "machine" in saved and "date" in saved
    assert saved["speed"] > 0 and saved["warmup_speed"] > 0


def test_iter_past_one_epoch_is_flagged(tiny_dataset, tmp_path, capsys) -> None:
    """Regression: a 2-GPU run at the same --iter as 1 GPU went into its second epoch (2.46M
    samples of a 1.8M split), so its TRAIN loss (0.439) was on already-seen samples and far
    below its EVAL loss (0.491): read as a mirror bug. Such runs now say so, and TRAIN lines
    carry the epoch (here 7 steps per epoch)."""
    log = tmp_path / "log.jsonl"
    train(
        _cfg(tiny_dataset.root, iter=10, log_json=log),
        DistEnv.single(),
        embedding_factory=local_factory,
    )
    text = capsys.readouterr().out
    assert re.search(
        r"^note: --iter 10 is 1\.43 epochs .* from step 8 on samples repeat", text, re.M
    )
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["step"], r["epoch"]) for r in recs if r["kind"] == "train"] == [
        (3, 0), (6, 0), (9, 1), (10, 1)
    ]  # fmt: skip
    assert re.search(r"^TRAIN 9: loss \S+ .* epoch 1$", text, re.M)
    train(_cfg(tiny_dataset.root, iter=7), DistEnv.single(), embedding_factory=local_factory)
    assert "samples repeat" not in capsys.readouterr().out  # one full epoch: nothing repeats


def test_training_reduces_loss(tmp_path) -> None:
    """A learnable signal: label = id of field 0 is even. Training must find it."""
    from hetgmp.data.format import make_fields, write_dataset

    rng = np.random.default_rng(1)
    fields = make_fields(["a", "b"], [20, 5])

    def split(n):
        a = rng.integers(0, 20, n)
        sp = np.stack([a, 20 + rng.integers(0, 5, n)], axis=1)
        return sp, None, (a % 2 == 0).astype(np.float32)

    ds = write_dataset(tmp_path / "sig", fields, {"train": split(2000), "test": split(500)})
    res = train(
        _cfg(
            ds.root,
            model="wdl",
            epochs=3,
            lr=0.5,
            dense_optimizer="adam",
            dense_lr=0.01,
            log_every=100,
        ),
        DistEnv.single(),
        embedding_factory=local_factory,
    )
    assert res["val_auc"] > 0.95


def _eval_on_ranks(env: DistEnv, root: str, world_seed: int) -> float:
    from hetgmp.data.format import open_dataset

    ds = open_dataset(root)
    torch.manual_seed(world_seed)
    emb = LocalEmbedding(ds.meta.num_embeddings, 4, lr=0.1, seed=world_seed)
    model = build_model(
        "dcn", emb, num_fields=ds.meta.num_fields, num_dense=ds.meta.num_dense, embed_dim=4
    )
    # eval batch 7 does not divide the shards: ranks run out at different steps
    return evaluate(model, ds.test, env, batch_size=7).val_auc


def test_global_auc_is_the_same_for_1_2_4_ranks(tiny_dataset) -> None:
    one = _eval_on_ranks(DistEnv.single(), str(tiny_dataset.root), 3)
    # the exact AUC of the whole split, computed directly
    ds = tiny_dataset
    torch.manual_seed(3)
    emb = LocalEmbedding(ds.meta.num_embeddings, 4, lr=0.1, seed=3)
    model = build_model("dcn", emb, num_fields=3, num_dense=2, embed_dim=4).eval()
    with torch.no_grad():
        p = torch.sigmoid(
            model(
                torch.from_numpy(np.asarray(ds.test.sparse, dtype=np.int64)),
                torch.from_numpy(np.array(ds.test.dense)),
            )
        ).numpy()
    assert one == pytest.approx(roc_auc(ds.test.labels, p), abs=1e-9)
    for n in (2, 4):
        aucs = spawn_ranks(_eval_on_ranks, n, str(tiny_dataset.root), 3, timeout_s=120)
        assert aucs == [aucs[0]] * n
        assert aucs[0] == pytest.approx(one, abs=1e-9)


def test_config_checks() -> None:
    with pytest.raises(ConfigError, match="resume"):
        validate(TrainConfig(resume=True))
    with pytest.raises(ConfigError, match="batch_size"):
        validate(TrainConfig(batch_size=0))
    with pytest.raises(ConfigError, match="store_rate"):
        validate(TrainConfig(store_rate=1.5))
    # (--store_rate without --partition is valid: the run makes its own plan, HET-GMP's habit;
    # tests/test_train_dist.py::test_no_partition_with_mirrors_makes_its_own_plan)
    validate(TrainConfig(store_rate=0.1))


def test_cli_reports_bad_dataset_cleanly(tmp_path, capsys) -> None:
    from hetgmp.cli import main

    rc = main(
        [
            "train",
            "--dataset",
            str(tmp_path / "nope"),
            "--cache-dir",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "nope" in err and "Traceback" not in err


def test_json_log_records_say_when_and_how_long(tiny_dataset, tmp_path) -> None:
    """Every JSON-lines record carries its wall-clock ``timestamp``; a train record's ``time``
    is its interval's duration (it used to overwrite the timestamp)."""
    import json

    from hetgmp.comm.env import DistEnv
    from hetgmp.train.run import train

    log = tmp_path / "log.jsonl"
    train(_cfg(tiny_dataset.root, iter=6, log_every=2, log_json=log), DistEnv.single(),
          embedding_factory=local_factory)  # fmt: skip
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    stamps = [r["timestamp"] for r in recs]
    assert stamps == sorted(stamps) and all(s > 1.6e9 for s in stamps)
    trains = [r for r in recs if r["kind"] == "train"]
    assert len(trains) == 3 and all(0 <= r["time"] < 600 for r in trains)


def test_empty_test_split_gives_null_metrics(tmp_path) -> None:
    """No test samples: the metrics are undefined and the results JSON says null (strict
    JSON), not NaN."""
    import json

    import numpy as np

    from hetgmp.comm.env import DistEnv
    from hetgmp.data.format import make_fields, write_dataset
    from hetgmp.train.run import train

    rng = np.random.default_rng(0)
    fields = make_fields(["a", "b"], [5, 9])
    offs = np.array([f.offset for f in fields])

    def split(n: int):
        local = np.stack([rng.integers(0, c, n) for c in (5, 9)], axis=1)
        return local + offs, None, (rng.random(n) < 0.3).astype(np.float32)

    ds = write_dataset(tmp_path / "d", fields, {"train": split(64), "test": split(0)})
    out = tmp_path / "r.json"
    res = train(
        _cfg(ds.root, iter=2, output=out), DistEnv.single(), embedding_factory=local_factory
    )
    assert res["val_auc"] is None and res["val_loss"] is None

    def no_nan(c: str) -> None:
        raise AssertionError(f"non-JSON constant {c}")

    assert json.loads(out.read_text(), parse_constant=no_nan)["val_auc"] is None
