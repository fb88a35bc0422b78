"""Training on multi-hot fields with one rank on CPU (issue 34; several ranks:
tests/test_train_multi_hot_dist.py): the pooled lookup against ``F.embedding_bag`` (forward and
backward), the real trainer against a plain ``nn.EmbeddingBag`` model step by step, a generated multi-hot set trained above its trivial baseline, and the runs
not supported yet refused by name (several GPUs, a GPU with the one-GPU switch off; --sync
async and --rows-on host now train), the Python API."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_sgd_matches_plain_torch import train_recording
from torch import nn

from hetgmp.cli import main as cli_main
from hetgmp.comm.env import DistEnv
from hetgmp.config import validate
from hetgmp.data.format import make_fields, open_dataset, write_dataset
from hetgmp.data.generate import generate_criteo_like
from hetgmp.data.multi_hot_padded import PAD_ID, padded_ids
from hetgmp.embedding.init import initial_rows
from hetgmp.models.pooling import BagLayout
from hetgmp.train.config import TrainConfig

B, DIM, SEED, LR, EPOCHS = 32, 4, 3, 0.1, 2
CARD = [20, 7, 30, 12]  # two single-hot fields, then two multi-hot fields


def _bags(rng: np.random.Generator, n: int, lo: int, card: int, longest: int):
    lengths = rng.integers(0, longest + 1, n)  # (empty bags included)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return lo + rng.integers(0, card, int(offsets[-1])), offsets  # (repeats included)


def _data(root: Path):
    """Labels planted on the bags: a sample is positive when its first bag holds an id below
    a third of the field (10 % flipped); the other fields are noise."""
    rng = np.random.default_rng(0)
    every = make_fields(["a", "b", "h1", "h2"], CARD)
    offs = [f.offset for f in every]

    def split(n: int):
        sp = np.stack([offs[f] + rng.integers(0, CARD[f], n) for f in (0, 1)], 1)
        h1, h2 = _bags(rng, n, offs[2], CARD[2], 5), _bags(rng, n, offs[3], CARD[3], 3)
        low = [
            (h1[0][a:b] - offs[2] < CARD[2] // 3).any()
            for a, b in zip(h1[1][:-1], h1[1][1:], strict=True)
        ]
        y = (np.array(low) ^ (rng.random(n) < 0.1)).astype(np.float32)
        return sp, None, y, [h1, h2]

    return write_dataset(root, every[:2], {"train": split(480), "test": split(160)},
                         multi_hot=every[2:])  # fmt: skip


def _table(rows: int) -> nn.Embedding:
    table = nn.Embedding(rows, DIM)
    with torch.no_grad():
        table.weight.normal_()
    return table


@pytest.mark.parametrize("fixed", [False, True])  # (True: every slot handed to the table)
@pytest.mark.parametrize("pooling", [("sum", "sum"), ("mean", "mean"), ("sum", "mean")])
def test_pooled_lookup_equals_embedding_bag(
    tmp_path: Path, pooling: tuple[str, str], fixed: bool
) -> None:
    torch.manual_seed(0)
    ds = _data(tmp_path / "d")
    tr = ds.train
    widths = [int(mh.lengths().max()) for mh in tr.multi_hot]
    ids = torch.from_numpy(padded_ids(tr, widths))
    assert (ids[:, 2:] == PAD_ID).any()  # (short bags padded)
    layout = BagLayout(num_single=2, widths=tuple(widths), pooling=pooling, fixed=fixed)
    table = _table(ds.meta.num_embeddings)
    if fixed:  # the table sees every slot, no padding id, and no row the sample lacks
        flat = layout.table_ids(ids).reshape(ids.shape)
        assert (flat >= 0).all() and flat.shape == ids.shape
        assert all(
            set(r.tolist()) == set(i[i != PAD_ID].tolist()) for r, i in zip(flat, ids, strict=True)
        )
    out = layout.lookup(table, ids)
    assert out.shape == (len(tr), 4, DIM)
    # the reference: F.embedding_bag on the ragged arrays, the same weight
    ref_table = _table(1)
    ref_table.weight = nn.Parameter(table.weight.detach().clone())
    ref = [F.embedding(torch.from_numpy(np.array(tr.sparse)), ref_table.weight)]
    for mh, mode in zip(tr.multi_hot, pooling, strict=True):
        values = torch.from_numpy(np.array(mh.values, dtype=np.int64))
        offsets = torch.from_numpy(np.array(mh.offsets[:-1]))
        ref.append(F.embedding_bag(values, ref_table.weight, offsets, mode=mode).unsqueeze(1))
    want = torch.cat(ref, dim=1)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    # backward: the same gradient on every row (pooled gradients scattered to the bag values)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    (want * g).sum().backward()
    # (a row's gradient summed over its occurrences in another order: float rounding only)
    torch.testing.assert_close(table.weight.grad, ref_table.weight.grad, rtol=1e-5, atol=1e-5)


class PlainBagWDL(nn.Module):
    """WDL written the usual way on one ``nn.EmbeddingBag``: single-hot ids as bags of one."""

    def __init__(self, rows: int, fields: int, pooling: tuple[str, ...]) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(rows, DIM, mode="sum")
        self.pooling = pooling
        d = fields * DIM
        self.wide = nn.Linear(d, 1)
        self.deep = nn.Sequential(nn.Linear(d, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                  nn.Linear(256, 256), nn.ReLU())  # fmt: skip
        self.deep_out = nn.Linear(256, 1)

    def forward(self, single: torch.Tensor, bags: list[tuple[torch.Tensor, torch.Tensor]]):
        n = single.numel()
        parts = [self.bag(single.reshape(-1), torch.arange(n)).reshape(single.shape[0], -1)]
        for (values, offsets), mode in zip(bags, self.pooling, strict=True):
            parts.append(F.embedding_bag(values, self.bag.weight, offsets, mode=mode))
        x = torch.cat(parts, dim=1)
        return self.wide(x) + self.deep_out(self.deep(x))


def _batch_bags(split, i: int, j: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for mh in split.multi_hot:
        a, b = int(mh.offsets[i]), int(mh.offsets[j])
        values = torch.from_numpy(np.array(mh.values[a:b], dtype=np.int64))
        out.append((values, torch.from_numpy(np.array(mh.offsets[i:j]) - a)))
    return out


@pytest.mark.parametrize("data_on_device", ["auto", "on"])
def test_sgd_training_equals_an_embedding_bag_model(
    tmp_path: Path, monkeypatch, data_on_device: str
) -> None:
    """``on``: the samples resident on the device, as on a GPU (its id check lets the bags'
    padding through; it stopped the first GPU run of a multi-hot set)."""
    torch.set_num_threads(1)
    ds = _data(tmp_path / "d")
    log = tmp_path / "log.jsonl"
    cfg = validate(TrainConfig(
        dataset=str(ds.root), model="wdl", batch_size=B, embed_dim=DIM, epochs=EPOCHS,
        optimizer="sgd", dense_optimizer="sgd", lr=LR, seed=SEED, shuffle=False, device="cpu",
        log_every=1, warmup_steps=0, progress=False, log_json=log, pooling="sum,mean",
        data_on_device=data_on_device,
    ))  # fmt: skip
    res, het, cap = train_recording(cfg, log, monkeypatch)

    rows = ds.meta.num_embeddings
    m = PlainBagWDL(rows, 4, ("sum", "mean"))
    m.load_state_dict({**cap["dense0"], "bag.weight": m.bag.weight.detach()})
    with torch.no_grad():
        m.bag.weight.copy_(initial_rows(torch.arange(rows), DIM, seed=SEED, scale=cfg.init_scale))
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    tr = ds.train
    x = torch.from_numpy(np.array(tr.sparse)).long()
    y = torch.from_numpy(np.array(tr.labels, dtype=np.float32)).reshape(-1, 1)
    plain = []
    for _ in range(EPOCHS):
        for i in range(0, len(x), B):  # shuffle off: contiguous batches
            j = min(i + B, len(x))
            loss = F.binary_cross_entropy_with_logits(m(x[i:j], _batch_bags(tr, i, j)), y[i:j])
            opt.zero_grad()
            loss.backward()
            opt.step()
            plain.append(loss.item())
    assert len(het) == len(plain) == EPOCHS * math.ceil(len(x) / B)
    np.testing.assert_allclose(het, plain, rtol=0, atol=1e-5)
    assert res["val_auc"] > 0.75  # (it learned the bags' labels: the comparison means more)
    te = ds.test
    with torch.no_grad():
        p = m(torch.from_numpy(np.array(te.sparse)).long(), _batch_bags(te, 0, len(te)))
        val = F.binary_cross_entropy_with_logits(
            p, torch.from_numpy(np.array(te.labels, dtype=np.float32)).reshape(-1, 1)
        ).item()
    assert abs(res["val_loss"] - val) < 1e-5


def test_generated_multi_hot_set_trains_above_its_trivial_baseline(tmp_path: Path) -> None:
    ds = generate_criteo_like(tmp_path / "g", num_samples=12000, scale=0.002, seed=1,
                              multi_hot="2:6", progress=False)  # fmt: skip
    out = tmp_path / "res.json"
    rc = cli_main(["train", "--dataset", str(ds.root), "--device", "cpu", "--epochs", "2",
                   "--batch-size", "256", "--pooling", "mean", "--threads", "1",
                   "--no-progress", "--output", str(out)])  # fmt: skip
    assert rc == 0
    res = json.loads(out.read_text())
    p = float(np.mean(ds.test.labels))
    constant = -(p * math.log(p) + (1 - p) * math.log(1 - p))  # the best constant's logloss
    # trivial baseline: AUC 0.5 and the constant's logloss; the planted best is the ceiling
    assert res["val_auc"] > 0.62 and res["val_loss"] < constant - 0.02
    assert res["val_auc"] < ds.meta.best_auc


def test_runs_not_supported_yet_are_refused_by_name(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = _data(tmp_path / "d")
    cfg = validate(TrainConfig(dataset=str(ds.root), batch_size=B, embed_dim=DIM, device="cpu",
                               progress=False, val=False, threads=1))  # fmt: skip
    from hetgmp.train import multi_hot
    from hetgmp.train.multi_hot import bag_layout, prepare

    gpu = DistEnv(device=torch.device("cuda"))
    # the one-GPU switch (on by default since a GPU run checked it): one CUDA rank passes,
    # two do not (named); off, any GPU is refused
    assert multi_hot.GPU_ONE_RANK and multi_hot.unsupported(cfg, gpu) == []
    two = DistEnv(device=torch.device("cuda"), world_size=2)
    # several CUDA ranks (fixed-shape bags, on since their GPU check passed); off: refused
    assert multi_hot.GPU_RANKS and multi_hot.unsupported(cfg, two) == []
    monkeypatch.setattr(multi_hot, "GPU_RANKS", False)
    assert multi_hot.unsupported(cfg, two) == ["2 CUDA ranks (one GPU only so far)"]
    with pytest.raises(ValueError, match=r"issue 34\); this run has 2 CUDA ranks"):
        prepare(cfg, two, open_dataset(ds.root))
    monkeypatch.setattr(multi_hot, "GPU_ONE_RANK", False)
    with pytest.raises(ValueError, match=r"issue 34\); this run has device cuda"):
        prepare(cfg, gpu, open_dataset(ds.root))
    # --sync async and --rows-on host train them (tests/test_train_multi_hot_async.py,
    # test_train_multi_hot_host.py): nothing refused on CPU, one rank or several; several
    # GPUs still are, with host rows too
    two_cpu = DistEnv(device=torch.device("cpu"), world_size=2)
    host = dataclasses.replace(cfg, rows_on="host")
    assert multi_hot.unsupported(dataclasses.replace(cfg, sync="async"), two_cpu) == []
    assert multi_hot.unsupported(host, two_cpu) == []
    with pytest.raises(ValueError, match=r"issue 34\); this run has device cuda"):
        prepare(host, gpu, open_dataset(ds.root))  # (the one-GPU switch off)
    monkeypatch.setattr(multi_hot, "GPU_ONE_RANK", True)
    assert multi_hot.unsupported(host, gpu) == []
    with pytest.raises(ValueError, match=r"issue 34\); this run has 2 CUDA ranks"):
        prepare(host, two, open_dataset(ds.root))
    with pytest.raises(ValueError, match="multi-hot fields are not padded into the ids"):
        bag_layout(cfg, open_dataset(ds.root))  # (a data set not padded by prepare)
    # a plan (several ranks: tests/test_train_multi_hot_dist.py) trains with one rank too, and
    # so do --sync async (its loop of unequal steps, --max-lag 2) and --rows-on host
    plan = tmp_path / "p.npz"
    assert cli_main(["partition", "--data", str(ds.root), "-n", "1", "-o", str(plan)]) == 0
    assert cli_main(["train", "--dataset", str(ds.root), "--device", "cpu", "--iter", "2",
                     "--no-val", "--partition", str(plan), "--no-progress"]) == 0  # fmt: skip
    assert cli_main(["train", "--dataset", str(ds.root), "--device", "cpu", "--iter", "2",
                     "--no-val", "--sync", "async", "--max-lag", "2", "--no-progress"]) == 0  # fmt: skip
    assert cli_main(["train", "--dataset", str(ds.root), "--device", "cpu", "--iter", "2",
                     "--no-val", "--rows-on", "host", "--cache-budget", "1", "--no-progress"]) == 0  # fmt: skip
    assert cli_main(["train", "--dataset", str(ds.root), "--device", "cpu", "--pooling",
                     "sum,mean,sum", "--no-progress"]) != 0  # fmt: skip
    assert "--pooling sum,mean,sum: 3 modes for the 2 multi-hot fields" in capsys.readouterr().err
    # a trained checkpoint exports with its bags' pooling (served: tests/test_serve_multi_hot.py)
    ck = tmp_path / "ck"
    assert cli_main(["train", "--dataset", str(ds.root), "--device", "cpu", "--iter", "2",
                     "--no-val", "--checkpoint-dir", str(ck), "--no-progress"]) == 0  # fmt: skip
    assert cli_main(["export", str(ck), "--out", str(tmp_path / "m")]) == 0
    m = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert [(f["name"], f["pooling"]) for f in m["multi_hot"]] == [("h1", "sum"), ("h2", "sum")]
