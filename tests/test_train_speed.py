"""The fast training path computes what the plain path computes.

- every data path (samples on the device, background reader, gather in the training thread)
  trains to the same losses, AUC and final weights, on 1 and 2 ranks, through the real table;
- ``fit`` equals the plain loop (host ``BatchLoader`` batches through ``Trainer.step``);
- the device metrics equal the numpy ones (AUC bit for bit, with many ties); evaluation on two
  gloo ranks equals one process;
- the dense gradient bucket sums like ``sum_dense_grads``; fused/foreach optimizers step like
  the per-parameter loop;
- ``--profile-steps`` and ``data_wait`` appear in the results and the TRAIN lines.
No timings are asserted.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.config import validate
from hetgmp.data.format import open_dataset
from hetgmp.data.loader import BatchLoader
from hetgmp.metrics import (
    accuracy,
    accuracy_tensor,
    log_loss,
    log_loss_tensor,
    roc_auc,
    roc_auc_tensor,
)
from hetgmp.models import build_model
from hetgmp.train.accounting import TrainClock, global_batch_sizes
from hetgmp.train.checkpoint import open_checkpoint
from hetgmp.train.config import TrainConfig
from hetgmp.train.dense_sync import GradBucket, sum_dense_grads
from hetgmp.train.evaluate import evaluate, score_split
from hetgmp.train.optim import make_dense_optimizer
from hetgmp.train.profile import PHASES
from hetgmp.train.run import distributed_embedding, train
from hetgmp.train.runlog import RunLog
from hetgmp.train.trainer import Trainer

PATHS = [
    {"data_on_device": "on"},
    {"data_on_device": "off", "prefetch_batches": 3},
    {"data_on_device": "off", "prefetch_batches": 0},  # the plain path
]


def _cfg(ds_root, **kw) -> TrainConfig:
    base = dict(
        dataset=str(ds_root),
        batch_size=48,  # 400 samples: a partial last batch on every rank count
        embed_dim=4,
        log_every=3,
        progress=False,
        lr=0.1,
        dense_optimizer="adam",
        dense_lr=0.01,
        warmup_steps=2,
        threads=1,
        epochs=2,
        model="wdl",
    )
    base.update(kw)
    return validate(TrainConfig(**base))


def _train_each(env: DistEnv, cfgs: list[TrainConfig]) -> list[dict]:
    """Independent runs one after another in one spawn (starting ranks costs more)."""
    return [train(cfg, env) for cfg in cfgs]


def _state(ckdir):
    ck = open_checkpoint(ckdir)
    u = ck.embedding_union()
    return ck.dense()["model"], u["weight"][torch.argsort(u["ids"])]


def _train_losses(log) -> list[float]:
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    return [r["loss"] for r in recs if r["kind"] == "train"]


@pytest.mark.parametrize("ranks", [1, 2])
def test_every_data_path_trains_the_same(tiny_dataset, tmp_path, ranks: int) -> None:
    cfgs = [
        _cfg(
            tiny_dataset.root,
            checkpoint_dir=tmp_path / f"ck{i}",
            log_json=tmp_path / f"log{i}.jsonl",
            **path,
        )
        for i, path in enumerate(PATHS)
    ]
    if ranks == 1:
        firsts = [train(cfg, DistEnv.single()) for cfg in cfgs]
    else:  # (the three runs in one spawn)
        firsts = spawn_ranks(_train_each, 2, cfgs)[0]
    outs = []
    for cfg, res in zip(cfgs, firsts, strict=True):
        dense, weight = _state(cfg.checkpoint_dir)
        outs.append((res, _train_losses(cfg.log_json), dense, weight))
    (res0, losses0, dense0, weight0), *others = outs
    assert res0["data_source"] == "resident" and len(losses0) > 3
    for res, losses, dense, weight in others:
        assert res["val_auc"] == res0["val_auc"] and res["val_loss"] == res0["val_loss"]
        assert losses == losses0
        for k in dense0:
            torch.testing.assert_close(dense[k], dense0[k], rtol=0, atol=0, msg=k)
        torch.testing.assert_close(weight, weight0, rtol=0, atol=0)
    assert [o[0]["data_source"] for o in outs] == ["resident", "thread", "sync"]


def test_fit_equals_the_plain_loop(tiny_dataset, tmp_path) -> None:
    """``fit`` (resident batches, device sums) against host batches through ``Trainer.step``."""
    cfg = _cfg(tiny_dataset.root, val=False, data_on_device="on")

    def trainer() -> Trainer:
        ds = open_dataset(cfg.dataset)
        torch.manual_seed(cfg.seed)
        emb = distributed_embedding(cfg, DistEnv.single(), ds.meta.num_embeddings, 4, None)
        model = build_model("wdl", emb, num_fields=3, num_dense=2, embed_dim=4)
        return Trainer(
            cfg, DistEnv.single(), ds, model, RunLog(active=False), indices=np.arange(400)
        )

    fast = trainer()
    fast.fit()
    plain = trainer()
    losses = []
    for epoch in range(cfg.epochs):
        loader = BatchLoader(plain.dataset.train, 48, shuffle=True, seed=cfg.seed, epoch=epoch)
        for b, batch in enumerate(loader):
            losses.append(plain.step(batch, global_batch_sizes([400], 48, b))[0])
    for t in (fast, plain):
        t.model.embedding.flush()
    for k, v in plain.model.dense_state_dict().items():
        torch.testing.assert_close(fast.model.dense_state_dict()[k], v, rtol=0, atol=0, msg=k)
    sd_fast, sd_plain = fast.model.embedding.state_dict(), plain.model.embedding.state_dict()
    torch.testing.assert_close(sd_fast["weight"], sd_plain["weight"], rtol=0, atol=0)
    assert len(losses) == fast.position.step == 2 * 9


def test_device_metrics_equal_numpy_with_ties() -> None:
    rng = np.random.default_rng(11)
    for n in (1, 2, 3, 50, 1000, 20000):
        for levels in (1, 2, 7, 100, 10**6):
            y = (rng.random(n) < rng.random()).astype(np.float32)
            s = (rng.integers(0, levels, n) / levels).astype(np.float32)
            yt, st = torch.from_numpy(y), torch.from_numpy(s)
            want, got = roc_auc(y, s), float(roc_auc_tensor(yt, st))
            assert (np.isnan(want) and np.isnan(got)) or want == got, (n, levels)
            assert float(accuracy_tensor(yt, st)) == accuracy(y, s)
            assert float(log_loss_tensor(yt, st)) == pytest.approx(log_loss(y, s), rel=1e-12)
    with pytest.raises(ValueError, match="differ in length"):
        roc_auc_tensor(torch.zeros(3), torch.zeros(4))


def _evaluate(env: DistEnv, root: str, batch_size: int) -> tuple:
    ds = open_dataset(root)
    torch.manual_seed(5)
    model = build_model(
        "dcn", nn.Embedding(ds.meta.num_embeddings, 4), num_fields=3, num_dense=2, embed_dim=4
    )
    res = evaluate(model, ds.test, env, batch_size=batch_size)
    probs, labels = score_split(model, ds.test, env, batch_size=batch_size)
    return res, probs.numpy(), labels.numpy()


def _evaluate_50_and_9(env: DistEnv, root: str) -> tuple:
    """:func:`_evaluate` at batch 50 and at batch 9, in one spawn."""
    return _evaluate(env, root, 50), _evaluate(env, root, 9)


def test_two_rank_evaluation_equals_one(tiny_dataset) -> None:
    root = str(tiny_dataset.root)
    # Batches of 50: both runs score the same 50-sample batches, so the scores are bitwise
    # equal and so must be every metric (gathered in rank order = the split's order).
    ((one, p, y),) = spawn_ranks(_evaluate, 1, root, 50, timeout_s=120)
    assert one.samples == 100 and np.array_equal(y, np.asarray(tiny_dataset.test.labels).ravel())
    assert one.val_auc == roc_auc(y, p) and one.val_acc == accuracy(y, p)
    assert one.val_loss == pytest.approx(log_loss(y, p), rel=1e-12)
    both = spawn_ranks(_evaluate_50_and_9, 2, root, timeout_s=120)
    outs = [b50 for b50, _ in both]
    np.testing.assert_array_equal(np.concatenate([o[1] for o in outs]), p)
    for res, *_ in outs:
        assert res == one
    # Batches of 9 do not divide the shards: ranks run out at different steps; scores differ
    # from one process's only by matmul rounding of other batch shapes.
    for res, *_ in (b9 for _, b9 in both):
        assert res.samples == 100 and res.val_auc == pytest.approx(one.val_auc, abs=1e-6)
        assert res.val_loss == pytest.approx(one.val_loss, abs=1e-6)


def _bucket_vs_cat(env: DistEnv) -> list:
    torch.manual_seed(0)
    nets = [nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    x = torch.randn(5, 3) * (env.rank + 1)
    params = [list(n.parameters()) for n in nets]
    bucket = GradBucket(env, params[1])
    out = []
    for _ in range(2):  # twice: the views survive zeroing and a second backward
        for net in nets:
            net(x).sum().backward()
        sum_dense_grads(env, params[0])
        bucket.all_reduce()
        bucket.check_views()
        out.append([(a.grad.clone(), b.grad.clone()) for a, b in zip(*params, strict=True)])
        for p in params[0]:
            p.grad = None
        bucket.zero_()
    return out


def test_grad_bucket_sums_like_sum_dense_grads() -> None:
    for rank_out in spawn_ranks(_bucket_vs_cat, 2, timeout_s=120):
        for step in rank_out:
            for a, b in step:
                torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["sgd", "adagrad", "adam"])
def test_foreach_optimizers_step_like_the_loop(name: str) -> None:
    torch.manual_seed(1)
    a = [nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(3))]
    b = [nn.Parameter(p.detach().clone()) for p in a]
    fast = make_dense_optimizer(name, a, 0.1, torch.device("cpu"))
    assert fast.defaults["foreach"] is True
    loop = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}[name]
    slow = loop(b, lr=0.1, foreach=False)
    for _ in range(3):
        g = [torch.randn_like(p) for p in a]
        for ps, opt in ((a, fast), (b, slow)):
            for p, gi in zip(ps, g, strict=True):
                p.grad = gi.clone()
            opt.step()
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


def test_profile_and_data_wait_are_reported(tiny_dataset, tmp_path, capsys) -> None:
    out = tmp_path / "res.json"
    cfg = _cfg(tiny_dataset.root, profile_steps=3, output=out, data_on_device="off")
    res = train(cfg, DistEnv.single())
    saved = json.loads(out.read_text())
    assert set(saved["step_ms"]) == {*PHASES, "steps"} and saved["step_ms"]["steps"] == 3
    assert all(np.isfinite(v) and v >= 0 for v in res["step_ms"].values())
    assert saved["data_wait_ms"] >= 0 and saved["data_source"] == "thread"
    assert saved["speed"] > 0 and saved["warmup_speed"] > 0 and saved["val_auc"] == res["val_auc"]
    assert saved["interval_speed"] > 0  # (the steady TRAIN intervals' median)
    text = capsys.readouterr().out
    assert "data: background reader 4 batches ahead" in text  # --prefetch-batches default
    assert "TRAIN 3: loss" in text and " data_wait " in text
    no_prof = train(_cfg(tiny_dataset.root, val=False), DistEnv.single())
    assert "step_ms" not in no_prof


def test_clock_books_segments_to_warmup_and_steady() -> None:
    """Samples land in the right bucket; segments are cut at warm-up; empty ones book nothing."""
    clock = TrainClock(torch.device("cpu"), warmup_steps=3)
    clock.resume()
    clock.pause()  # no step ran: nothing booked
    assert clock.speeds()["warmup_speed"] is None and clock.timing["warmup_s"] == 0.0
    clock.resume()
    for i in range(7):
        clock.count(10 + i, data_wait_s=0.001)
        if i == 4:
            with clock.paused():  # a TRAIN line / evaluation: not training time
                pass
    clock.pause()
    assert clock.timing["warmup_samples"] == 10 + 11 + 12
    assert clock.timing["steady_samples"] == 13 + 14 + 15 + 16
    assert clock.timing["steady_s"] > 0 and clock.timing["warmup_s"] > 0
    assert clock.speeds()["data_wait_ms"] == pytest.approx(1.0)
    assert clock.take_interval() == pytest.approx(clock.speeds()["train_seconds"])
    assert clock.take_interval() == 0.0


def test_steady_interval_speed_skips_the_first_interval_and_epoch_starts() -> None:
    """``interval_speed``: the median of the TRAIN intervals after the first whose epoch is
    the previous one's (an interval holding an epoch start carries its scan and captures)."""
    clock = TrainClock(torch.device("cpu"), warmup_steps=0)
    assert clock.steady_interval_speed() is None  # (no interval: no figure)
    clock.intervals = [(1.0, 0), (10.0, 0), (12.0, 0), (3.0, 1), (11.0, 1)]
    assert clock.steady_interval_speed() == 11.0
    clock.intervals = [(5.0, 0), (4.0, 1), (2.0, 2)]  # (every interval holds an epoch start)
    assert clock.speeds()["interval_speed"] is None
