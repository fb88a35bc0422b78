"""Multi-hot fields with rows in host memory (``--rows-on host``, issue 34) on CPU, through the
real trainer: with a cache of a fifth of the table (rows really move between host memory and
the cache) one rank trains bit for bit like the all-on-device run (rows, optimizer state,
dense layers, val loss), and its read-ahead is really used -- each next batch's table ids
(bags flattened, padding taken out: the padded batch, -1 slots and all, would be refused
ahead) staged a step early and taken by that batch's lookup; two gloo ranks (owned rows on
the host tier, staged at the step) equal their all-on-device run too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_tier_train import checkpoint_rows

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.config import validate
from hetgmp.data.format import make_fields, write_dataset
from hetgmp.embedding import tier_setup
from hetgmp.embedding.tier_ahead import AheadQueue
from hetgmp.train.config import TrainConfig
from hetgmp.train.run import train

CARDS = [200, 300, 500, 400]  # two single-hot fields, then two bag fields: 1,400 rows
LONGEST = (6, 4)  # the bag fields' longest bags (empty ones included)


def _skewed(rng: np.random.Generator, n: int, card: int) -> np.ndarray:
    """Hot and cold ids (a cube of a uniform), so a cache hits and misses."""
    return (rng.random(n) ** 3 * card).astype(np.int64)


def _data(root: Path) -> Path:
    rng = np.random.default_rng(5)
    every = make_fields(["a", "b", "h1", "h2"], CARDS)
    offs = [f.offset for f in every]

    def split(n: int) -> tuple[Any, ...]:
        sp = np.stack([offs[f] + _skewed(rng, n, CARDS[f]) for f in (0, 1)], 1)
        bags = []
        for f, longest in zip((2, 3), LONGEST, strict=True):
            lengths = rng.integers(0, longest + 1, n)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            bags.append((offs[f] + _skewed(rng, int(offsets[-1]), CARDS[f]), offsets))
        dense = rng.random((n, 2), dtype=np.float32)
        return sp, dense, (rng.random(n) < 0.3).astype(np.float32), bags

    write_dataset(root, every[:2], {"train": split(320), "test": split(64)}, num_dense=2,
                  multi_hot=every[2:])  # fmt: skip
    return root


@pytest.fixture
def bags(tmp_path: Path) -> Path:
    return _data(tmp_path / "bags")


def _cfg(root: Path, **kw: object) -> TrainConfig:
    base = dict(dataset=str(root), batch_size=16, eval_batch_size=16, embed_dim=4, epochs=1,
                log_every=10, progress=False, threads=1, lr=0.05, dense_optimizer="adam",
                pooling="sum,mean", device="cpu", val=True)  # fmt: skip
    return validate(TrainConfig(**{**base, **kw}))


def _same_checkpoints(a: Path, b: Path) -> None:
    (ad, aw, as_), (bd, bw, bs) = checkpoint_rows(a), checkpoint_rows(b)
    assert set(ad) == set(bd) and all(torch.equal(ad[k], bd[k]) for k in ad)
    assert torch.equal(aw, bw) and torch.equal(as_, bs)


def test_one_rank_host_rows_equal_device_and_read_ahead_is_taken(
    bags: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host-decided tier (several ranks use it): 20 steps, a 20 % cache (280 rows: a
    batch's distinct rows and the next one's fit beside each other, the table does not): the
    same checkpoint and val loss as the device table; every lookup but the first takes a batch
    staged a step ahead."""
    monkeypatch.setattr(tier_setup, "DEVICE_TIER", False)
    dev = train(_cfg(bags, checkpoint_dir=tmp_path / "dev"), DistEnv.single())
    taken = {"staged": 0}
    take = AheadQueue.take

    def counted(self: AheadQueue, ids: torch.Tensor) -> Any:
        got = take(self, ids)
        taken["staged"] += got is not None and got.state == "staged"
        return got

    monkeypatch.setattr(AheadQueue, "take", counted)
    host_cfg = _cfg(bags, checkpoint_dir=tmp_path / "host", rows_on="host", cache_budget=0.2)
    host = train(host_cfg, DistEnv.single())
    assert host["val_loss"] == dev["val_loss"] and host["val_auc"] == dev["val_auc"]
    _same_checkpoints(tmp_path / "dev", tmp_path / "host")
    t = host["host_tier"]
    assert t["steps"] == 20 and t["cache_rows"] == 280 and t["table_rows"] == sum(CARDS)
    assert t["misses"] > 0 and t["hits"] > 0 and t["evictions"] > 0 and t["written_back"] > 0
    # the read-ahead: staged ahead and taken by the step (a padded batch is never staged, a
    # tensor other than the one the lookup hands the table never taken)
    assert t["ahead"] >= 15 and taken["staged"] == t["ahead"], (t, taken)


def test_one_rank_device_tier_equals_device(bags: Path, tmp_path: Path) -> None:
    """The one-rank default, the tier decided on the device: the bags' table ids (padding
    taken out) looked up through its working table give the same checkpoint and val loss as
    the device table, with real misses written back."""
    dev = train(_cfg(bags, checkpoint_dir=tmp_path / "dev"), DistEnv.single())
    host_cfg = _cfg(bags, checkpoint_dir=tmp_path / "host", rows_on="host", cache_budget=0.2)
    host = train(host_cfg, DistEnv.single())
    assert host["val_loss"] == dev["val_loss"] and host["val_auc"] == dev["val_auc"]
    _same_checkpoints(tmp_path / "dev", tmp_path / "host")
    t = host["host_tier"]
    assert t["steps"] == 20 and t["misses"] > 0 and t["hits"] > 0 and t["written_back"] > 0


def _train_each(env: DistEnv, cfgs: list[TrainConfig]) -> list[dict]:
    return [train(cfg, env) for cfg in cfgs]


def test_two_ranks_host_rows_equal_device(bags: Path, tmp_path: Path) -> None:
    """Two gloo ranks at bound 0, each rank's owned rows (~700) on a 40 % cache: the same
    checkpoint and val loss as the same run all on the device."""
    cfgs = [
        _cfg(bags, checkpoint_dir=tmp_path / "dev"),
        _cfg(bags, checkpoint_dir=tmp_path / "host", rows_on="host", cache_budget=0.4),
    ]
    dev, host = spawn_ranks(_train_each, 2, cfgs, timeout_s=120)[0]
    assert host["val_loss"] == dev["val_loss"] and host["val_auc"] == dev["val_auc"]
    _same_checkpoints(tmp_path / "dev", tmp_path / "host")
    t = host["host_tier"]
    assert t["misses"] > 0 and t["evictions"] > 0 and t["written_back"] > 0
    assert t["table_rows"] == sum(CARDS) and len(t["ranks"]) == 2
