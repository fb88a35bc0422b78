"""Regression (issue item 4): hetgmp's WDL with SGD rows + SGD dense must do exactly what a plain
PyTorch WDL does (nn.Embedding, mean BCE, torch.optim.SGD on everything, wide = Linear over the
concatenated input) given the same initial values, batches and learning rates. Runs the real
trainer (``hetgmp.train.run.train``, DistributedEmbedding, one process, bound 0)."""

from __future__ import annotations

import json

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hetgmp.comm.env import DistEnv
from hetgmp.config import validate
from hetgmp.data.format import make_fields, write_dataset
from hetgmp.embedding.init import initial_rows
from hetgmp.train.config import TrainConfig
from hetgmp.train.run import train

B, DIM, SEED, LR, EPOCHS = 64, 4, 3, 0.1, 2


def _data(tmp_path):
    rng = np.random.default_rng(0)
    card = [30, 12, 5]
    fields = make_fields(["a", "b", "c"], card)
    offs = np.cumsum([0] + card[:-1])

    def split(n):
        sp = np.stack([o + rng.integers(0, c, n) for o, c in zip(offs, card, strict=True)], 1)
        y = ((sp[:, 0] % 3 == 0) ^ (rng.random(n) < 0.2)).astype(np.float32)
        return sp, None, y

    return write_dataset(tmp_path / "d", fields, {"train": split(600), "test": split(200)})


class PlainWDL(nn.Module):  # written the usual way
    def __init__(self, rows, fields, dim):
        super().__init__()
        self.emb = nn.Embedding(rows, dim)
        d = fields * dim
        self.wide = nn.Linear(d, 1)
        self.deep = nn.Sequential(
            nn.Linear(d, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
        )
        self.deep_out = nn.Linear(256, 1)

    def forward(self, ids):
        x = self.emb(ids).flatten(1)
        return self.wide(x) + self.deep_out(self.deep(x))


def train_recording(cfg: TrainConfig, log, monkeypatch) -> tuple[dict, list[float], dict]:
    """``hetgmp train`` on one process: ``(results, the TRAIN losses of every step from the
    JSON log, {"dense0": the model's initial dense layers})`` (a plain model starts from those)."""
    import hetgmp.train.run as run_mod

    cap = {}
    orig = run_mod.build_model

    def capture(*a, **k):
        model = orig(*a, **k)
        cap["dense0"] = {n: t.clone() for n, t in model.dense_state_dict().items()}
        return model

    monkeypatch.setattr(run_mod, "build_model", capture)
    res = train(cfg, DistEnv.single())
    losses = [r["loss"] for r in map(json.loads, log.read_text().splitlines())
              if r["kind"] == "train"]  # fmt: skip
    return res, losses, cap


def test_sgd_training_equals_plain_pytorch(tmp_path, monkeypatch) -> None:
    torch.set_num_threads(1)
    ds = _data(tmp_path)
    log = tmp_path / "log.jsonl"
    cfg = validate(TrainConfig(
        dataset=str(ds.root), model="wdl", batch_size=B, embed_dim=DIM, epochs=EPOCHS,
        optimizer="sgd", dense_optimizer="sgd", lr=LR, seed=SEED, shuffle=False,
        log_every=1, warmup_steps=0, progress=False, log_json=log,
    ))  # fmt: skip
    res, het_losses, cap = train_recording(cfg, log, monkeypatch)

    # plain: same dense init (same seed, same construction order), same initial rows
    rows, nf = ds.meta.num_embeddings, ds.meta.num_fields
    torch.manual_seed(SEED)
    m = PlainWDL(rows, nf, DIM)
    # the same dense initial values (nn.Embedding's own N(0,1) init consumed the RNG first)
    m.load_state_dict({**cap["dense0"], "emb.weight": m.emb.weight.detach()})
    with torch.no_grad():
        m.emb.weight.copy_(initial_rows(torch.arange(rows), DIM, seed=SEED, scale=cfg.init_scale))
    opt = torch.optim.SGD(m.parameters(), lr=LR)  # the dense lr default for sgd: --lr
    tr = ds.split("train")
    x = torch.from_numpy(np.array(tr.sparse)).long()
    y = torch.from_numpy(np.array(tr.labels, dtype=np.float32)).reshape(-1, 1)
    plain_losses = []
    for _ in range(EPOCHS):
        for i in range(0, len(x), B):  # shuffle off: contiguous batches, last one partial
            loss = F.binary_cross_entropy_with_logits(m(x[i : i + B]), y[i : i + B])
            opt.zero_grad()
            loss.backward()
            opt.step()
            plain_losses.append(loss.item())
    assert len(het_losses) == len(plain_losses)
    np.testing.assert_allclose(het_losses, plain_losses, rtol=0, atol=1e-5)
    te = ds.split("test")
    with torch.no_grad():
        p = m(torch.from_numpy(np.array(te.sparse)).long())
        val = F.binary_cross_entropy_with_logits(
            p, torch.from_numpy(np.array(te.labels, dtype=np.float32)).reshape(-1, 1)
        ).item()
    assert abs(res["val_loss"] - val) < 1e-5
