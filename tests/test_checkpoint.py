"""Checkpoints: exact resume, atomic commit, clear errors for truncated / foreign files, and plans
made for another worker count."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_train import _cfg, local_factory

from hetgmp.comm.env import DistEnv
from hetgmp.partition.plan import Plan, PlanError, save_plan
from hetgmp.train.checkpoint import CheckpointError, open_checkpoint
from hetgmp.train.run import train


def _final_state(ckdir: Path) -> tuple[dict, torch.Tensor]:
    ck = open_checkpoint(ckdir)
    emb = ck.embedding_union()
    order = torch.argsort(emb["ids"])
    return ck.dense()["model"], emb["weight"][order]


def test_resume_is_exact(tiny_dataset, tmp_path) -> None:
    """2k steps straight == k steps, stop, resume for k more (k=5 crosses the 7-step epoch)."""
    kw = dict(dense_optimizer="adam", dense_lr=0.01, val=False)
    straight = tmp_path / "straight"
    train(
        _cfg(tiny_dataset.root, iter=10, checkpoint_dir=straight, **kw),
        DistEnv.single(),
        embedding_factory=local_factory,
    )
    halves = tmp_path / "halves"
    train(
        _cfg(tiny_dataset.root, iter=5, checkpoint_dir=halves, **kw),
        DistEnv.single(),
        embedding_factory=local_factory,
    )
    assert open_checkpoint(halves).position.step == 5
    train(
        _cfg(tiny_dataset.root, iter=10, checkpoint_dir=halves, resume=True, **kw),
        DistEnv.single(),
        embedding_factory=local_factory,
    )
    (da, ea), (db, eb) = _final_state(straight), _final_state(halves)
    assert open_checkpoint(halves).position.step == 10
    assert set(da) == set(db)
    for k in da:
        torch.testing.assert_close(da[k], db[k], rtol=0, atol=0)
    torch.testing.assert_close(ea, eb, rtol=0, atol=0)
    # the resumed half did change the state (the comparison is not vacuous)
    d5, e5 = _final_state(halves / "step-00000005")
    assert not torch.equal(e5, eb)
    assert any(not torch.equal(d5[k], db[k]) for k in db)


def test_checkpoint_every_keeps_latest_and_prunes(tiny_dataset, tmp_path) -> None:
    ck = tmp_path / "ck"
    train(
        _cfg(
            tiny_dataset.root,
            iter=9,
            checkpoint_dir=ck,
            checkpoint_every=2,
            val=False,
            keep_checkpoints=2,
        ),
        DistEnv.single(),
        embedding_factory=local_factory,
    )
    names = sorted(p.name for p in ck.glob("step-*"))
    assert names == ["step-00000008", "step-00000009"]
    assert (ck / "latest").read_text().strip() == "step-00000009"
    assert not list(ck.glob(".*tmp*"))
    m = json.loads((ck / "step-00000009" / "manifest.json").read_text())
    assert m["config"]["checkpoint_every"] == 2 and m["dataset_fingerprint"]


def _one_checkpoint(tiny_dataset, tmp_path) -> Path:
    ck = tmp_path / "ck"
    train(
        _cfg(tiny_dataset.root, iter=2, checkpoint_dir=ck, val=False),
        DistEnv.single(),
        embedding_factory=local_factory,
    )
    return ck / "step-00000002"


def test_truncated_checkpoint_names_the_file(tiny_dataset, tmp_path) -> None:
    ck = _one_checkpoint(tiny_dataset, tmp_path)
    f = ck / "dense.pt"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"dense\.pt.*truncated"):
        open_checkpoint(ck)
    # resume through the CLI path gives the same clear error
    with pytest.raises(CheckpointError, match="dense.pt"):
        train(
            _cfg(tiny_dataset.root, iter=4, checkpoint_dir=ck.parent, resume=True, val=False),
            DistEnv.single(),
            embedding_factory=local_factory,
        )


def test_corrupted_and_foreign_checkpoints(tiny_dataset, tmp_path) -> None:
    ck = _one_checkpoint(tiny_dataset, tmp_path)
    f = ck / "embedding-0.pt"
    data = bytearray(f.read_bytes())
    data[-20] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"embedding-0\.pt.*SHA-256"):
        open_checkpoint(ck)
    (ck / "manifest.json").write_text('{"format": "something-else"}')
    with pytest.raises(CheckpointError, match=r"manifest\.json.*not a hetgmp checkpoint"):
        open_checkpoint(ck)
    (ck / "manifest.json").write_text('{"format": "hetgmp-checkp')
    with pytest.raises(CheckpointError, match=r"manifest\.json.*truncated"):
        open_checkpoint(ck)


def test_checkpoint_of_another_model_is_refused(tiny_dataset, tmp_path) -> None:
    ck = _one_checkpoint(tiny_dataset, tmp_path)
    with pytest.raises(CheckpointError, match="model='wdl'.*model='dcn'"):
        train(
            _cfg(
                tiny_dataset.root,
                model="dcn",
                iter=4,
                checkpoint_dir=ck.parent,
                resume=True,
                val=False,
            ),
            DistEnv.single(),
            embedding_factory=local_factory,
        )


def test_plan_for_another_worker_count_is_refused(tiny_dataset, tmp_path) -> None:
    n, r = len(tiny_dataset.train), tiny_dataset.meta.num_embeddings
    plan = Plan(
        np.arange(n) % 2,
        np.arange(r) % 2,
        [np.zeros(0, np.int64)] * 2,
        {"dataset_fingerprint": tiny_dataset.fingerprint},
    )
    path = save_plan(plan, tmp_path / "part.npz")
    with pytest.raises(PlanError, match=r"made for 2 workers but 1 is running.*-n 1"):
        train(
            _cfg(tiny_dataset.root, partition=path, iter=1),
            DistEnv.single(),
            embedding_factory=local_factory,
        )
    bad = Plan(
        np.zeros(n + 1, np.int32),
        np.zeros(r, np.int32),
        [np.zeros(0, np.int64)],
        {"dataset_fingerprint": tiny_dataset.fingerprint},
    )
    with pytest.raises(PlanError, match="training samples"):
        train(
            _cfg(tiny_dataset.root, partition=save_plan(bad, tmp_path / "bad.npz"), iter=1),
            DistEnv.single(),
            embedding_factory=local_factory,
        )
