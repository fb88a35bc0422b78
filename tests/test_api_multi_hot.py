"""The Python API on multi-hot data sets (issue 34): ``build_model`` + ``Trainer.fit`` train
bit for bit what ``hetgmp train`` trains with the same options and seed (losses, metrics, dense
parameters, rows and optimizer states), on one rank and on two real gloo ranks with the
fallback plan's mirrors; ``evaluate`` / ``predict`` score the bags; a bad ``pooling`` and a GPU
are refused clearly, the GPU with the CLI's own message; a single-hot data set is unaffected.
(The CLI path itself is checked against ``F.embedding_bag`` in tests/test_train_multi_hot.py.)"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_python_api import _same_checkpoints
from test_train_multi_hot import _data

import hetgmp
from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.config import validate
from hetgmp.data.dataset_meta import DatasetError
from hetgmp.data.multi_hot_padded import PaddedBags
from hetgmp.metrics import log_loss, roc_auc
from hetgmp.train.config import TrainConfig
from hetgmp.train.multi_hot import prepare
from hetgmp.train.run import train

SHARED = dict(embed_dim=4, lr=0.1, optimizer="adagrad", seed=3)
LOOP = dict(batch_size=32, dense_optimizer="sgd", dense_lr=0.05, log_every=1, warmup_steps=0)


def _losses(log: Path) -> list[float]:
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def _cli_then_api(env: DistEnv, root: str, tmp: str, store_rate: float) -> dict:
    """`hetgmp train`'s path, then the API's, with the same options (pooling per field: the CLI
    as text, the API as a tuple); returns both results and the API's predictions. (Rank 0
    writes the JSON logs of both.)"""
    torch.set_num_threads(1)
    out = Path(tmp)
    cfg = TrainConfig(
        dataset=root, epochs=2, progress=False, threads=1, pooling="sum,mean",
        store_rate=store_rate, checkpoint_dir=out / "cli", log_json=out / "cli.jsonl",
        **SHARED, **LOOP,
    )  # fmt: skip
    cli = train(validate(cfg), env)
    ds = hetgmp.open_dataset(root)
    model = hetgmp.build_model(ds, env, pooling=("sum", "mean"), store_rate=store_rate, **SHARED)
    trainer = hetgmp.Trainer(
        model, ds, env, epochs=2, checkpoint_dir=out / "api", stream=io.StringIO(),
        log_json=out / "api.jsonl", **LOOP,
    )  # fmt: skip
    api = trainer.fit()
    trainer.close()
    probs = trainer.predict()
    keys = ("val_auc", "val_loss", "val_acc", "step", "samples_seen")
    return {
        "cli": {k: cli[k] for k in keys}, "api": {k: api[k] for k in keys}, "probs": probs,
        "evaluate": trainer.evaluate().val_auc, "padded": isinstance(trainer.dataset, PaddedBags),
        "train_probs": trainer.predict("train").shape,
    }  # fmt: skip


def _check_equal(res: dict, out: Path, ds) -> None:
    assert res["padded"]  # (the Trainer reads the bags padded, as the CLI does)
    assert res["api"] == res["cli"]  # metrics, steps, samples: exactly
    cli, api = _losses(out / "cli.jsonl"), _losses(out / "api.jsonl")
    assert len(cli) == len(api) > 10 and cli == api  # every step's loss, exactly
    _same_checkpoints(out / "cli", out / "api")  # dense, rows, optimizer states: bit for bit
    # predict: every test sample in stored order, the probabilities evaluate scores
    probs, labels = res["probs"], np.asarray(ds.test.labels)
    assert probs.shape == (len(ds.test),) and res["train_probs"] == (len(ds.train),)
    assert roc_auc(labels, probs) == pytest.approx(res["evaluate"], abs=1e-9)
    assert log_loss(labels, probs) == pytest.approx(res["api"]["val_loss"], abs=1e-5)
    assert res["api"]["val_auc"] > 0.75  # (it learned the planted bags: the equality means more)


def test_api_fit_equals_cli_one_rank(tmp_path: Path) -> None:
    ds = _data(tmp_path / "d")
    res = _cli_then_api(DistEnv.single("cpu"), str(ds.root), str(tmp_path), 0.0)
    _check_equal(res, tmp_path, ds)


def test_api_fit_equals_cli_two_gloo_ranks(tmp_path: Path) -> None:
    """Two real gloo ranks, store_rate 0.5: the fallback plan counts the padded bags' ids."""
    ds = _data(tmp_path / "d")
    res = spawn_ranks(_cli_then_api, 2, str(ds.root), str(tmp_path), 0.5, timeout_s=120)
    assert np.array_equal(res[0]["probs"], res[1]["probs"])  # (the same array on every rank)
    _check_equal(res[0], tmp_path, ds)


def test_bad_pooling_and_gpu_are_refused_clearly(tmp_path: Path, monkeypatch) -> None:
    ds = _data(tmp_path / "d")
    env = DistEnv.single("cpu")
    count = r"pooling='sum,mean,sum': 3 modes for the 2 multi-hot fields of .*d \(h1, h2\); give"
    with pytest.raises(DatasetError, match=count):
        hetgmp.build_model(ds, env, embed_dim=4, pooling=("sum", "mean", "sum"))
    with pytest.raises(ValueError, match=r"pooling: unknown mode 'max' in 'sum,max'"):
        hetgmp.build_model(ds, env, embed_dim=4, pooling="sum,max")
    with pytest.raises(ValueError, match=r"pooling: unknown mode 'max' in \['max'\]"):
        hetgmp.build_model(ds, env, embed_dim=4, pooling=["max"])
    for bad in (3, (), ("sum", 1)):
        with pytest.raises(TypeError, match="pooling: expected a mode"):
            hetgmp.build_model(ds, env, embed_dim=4, pooling=bad)
    # several GPUs with their switch off: refused before anything is built, with the message
    # `hetgmp train` gives
    from hetgmp.train import multi_hot

    monkeypatch.setattr(multi_hot, "GPU_RANKS", False)
    gpus = DistEnv(device=torch.device("cuda"), world_size=2)
    with pytest.raises(DatasetError) as api_err:
        hetgmp.build_model(ds, gpus, embed_dim=4)
    with pytest.raises(DatasetError) as cli_err:
        prepare(validate(TrainConfig(dataset=str(ds.root))), gpus, ds)
    assert str(api_err.value) == str(cli_err.value)
    assert "(issue 34); this run has 2 CUDA ranks (one GPU only so far)" in str(api_err.value)
    # --sync async / --rows-on host are no build_model options: unknown, by name
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['sync'\]"):
        hetgmp.build_model(ds, env, sync="async")


def test_trainer_data_must_match_the_model(tmp_path: Path, tiny_dataset) -> None:
    """The same data opened again reuses the model's padded set; another data set is refused."""
    ds = _data(tmp_path / "d")
    env = DistEnv.single("cpu")
    model = hetgmp.build_model(ds, env, embed_dim=4, pooling="mean")
    assert model.bags is not None and model.bags.pooling == ("mean", "mean")
    again = hetgmp.Trainer(model, hetgmp.open_dataset(ds.root), env, verbose=False)
    assert isinstance(again.dataset, PaddedBags) and again.dataset.fingerprint == ds.fingerprint
    with pytest.raises(DatasetError, match="no multi-hot fields, but the model pools bags"):
        hetgmp.Trainer(model, tiny_dataset, env, verbose=False)
    plain = hetgmp.build_model(tiny_dataset, env, embed_dim=4)
    with pytest.raises(DatasetError, match="multi-hot fields, but the model pools no bags"):
        hetgmp.Trainer(plain, ds, env, verbose=False)


def test_single_hot_data_set_is_unaffected(tiny_dataset) -> None:
    """pooling= means nothing without multi-hot fields (as --pooling): the data set is read as
    it is, the model pools nothing, and it trains what it trains without the option."""
    torch.set_num_threads(1)
    env = DistEnv.single("cpu")
    runs = []
    for extra in ({}, {"pooling": ("mean", "sum", "mean")}):
        model = hetgmp.build_model(tiny_dataset, env, **SHARED, **extra)
        assert model.bags is None
        trainer = hetgmp.Trainer(model, tiny_dataset, env, iters=10, verbose=False, **LOOP)
        assert trainer.dataset is tiny_dataset
        res = trainer.fit()
        probs = trainer.predict()
        assert roc_auc(np.asarray(tiny_dataset.test.labels), probs) == pytest.approx(
            res["val_auc"], abs=1e-9
        )
        runs.append(probs)
    assert np.array_equal(runs[0], runs[1])
