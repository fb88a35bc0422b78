#!/usr/bin/env python
"""Independent plain-PyTorch WDL, written the usual way, with one-at-a-time knobs toward hetgmp.

Baseline (all flags default): nn.Embedding N(0,1) init, WDL = wide Linear over the concatenated
input + MLP 256-256-256 + Linear(256,1), mean BCE, torch.optim.SGD lr 0.1 on everything,
batch 1024 (last partial batch kept), 3 epochs, per-epoch shuffle.
Only numpy / torch are used for training; data is read with numpy from the preprocessed dir.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

torch.set_num_threads(1)
p = argparse.ArgumentParser()
p.add_argument("--data", required=True, help="a preprocessed data set directory")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--lr", type=float, default=0.1)  # embedding lr
p.add_argument("--dense-lr", type=float, default=None)  # default: same as --lr
p.add_argument("--init", choices=["normal", "uniform"], default="normal")
p.add_argument("--scale", type=float, default=0.01)  # uniform half-width / normal std
p.add_argument("--wide", choices=["linear", "fused", "none"], default="linear")
p.add_argument("--loss", choices=["mean", "sum"], default="mean")
p.add_argument("--emb-opt", choices=["sgd", "adagrad_rowwise"], default="sgd")
p.add_argument("--dense-opt", choices=["sgd", "adam"], default="sgd")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--batch", type=int, default=1024)
p.add_argument("--dim", type=int, default=16)
p.add_argument("--out", default=None)
a = p.parse_args()

d = Path(a.data)
meta = json.load(open(d / "meta.json"))
rows = sum(f["cardinality"] for f in meta["fields"])
F_ = len(meta["fields"])
Xtr = torch.from_numpy(np.load(d / "train_sparse_feats.npy").astype(np.int64))
ytr = torch.from_numpy(np.load(d / "train_labels.npy").astype(np.float32)).reshape(-1, 1)
Xte = torch.from_numpy(np.load(d / "test_sparse_feats.npy").astype(np.int64))
yte = np.load(d / "test_labels.npy").reshape(-1)

torch.manual_seed(a.seed)
emb = nn.Embedding(rows, a.dim)  # default N(0,1)
if a.init == "uniform":
    with torch.no_grad():
        emb.weight.uniform_(-a.scale, a.scale)
elif a.scale != 0.01 and a.init == "normal":
    with torch.no_grad():
        emb.weight.normal_(0, a.scale)
in_dim = F_ * a.dim
wide = nn.Linear(in_dim, 1)
deep = nn.Sequential(
    nn.Linear(in_dim, 256),
    nn.ReLU(),
    nn.Linear(256, 256),
    nn.ReLU(),
    nn.Linear(256, 256),
    nn.ReLU(),
)
out = nn.Linear(256, 1)


def forward(ids):
    x = emb(ids).reshape(ids.shape[0], in_dim)
    if a.wide == "fused":  # hetgmp's form: wide logit = one more output row of deep[0]
        w = torch.cat([deep[0].weight, wide.weight])
        b = torch.cat([deep[0].bias, wide.bias])
        h = F.linear(x, w, b)
        z = h[:, :-1]
        for layer in list(deep)[1:]:
            z = layer(z)
        return h[:, -1:] + out(z)
    y = out(deep(x))
    return y + wide(x) if a.wide == "linear" else y


dense_params = list(wide.parameters()) + list(deep.parameters()) + list(out.parameters())
dlr = a.lr if a.dense_lr is None else a.dense_lr
dopt = (
    torch.optim.SGD(dense_params, lr=dlr)
    if a.dense_opt == "sgd"
    else torch.optim.Adam(dense_params, lr=dlr)
)
eopt = torch.optim.SGD(emb.parameters(), lr=a.lr) if a.emb_opt == "sgd" else None
acc = torch.full((rows,), 1e-7)

g = torch.Generator().manual_seed(a.seed)
N = Xtr.shape[0]
t0 = time.time()
losses = []
for _epoch in range(a.epochs):
    perm = torch.randperm(N, generator=g)
    for i in range(0, N, a.batch):
        idx = perm[i : i + a.batch]
        logits = forward(Xtr[idx])
        loss = F.binary_cross_entropy_with_logits(logits, ytr[idx], reduction=a.loss)
        dopt.zero_grad()
        emb.zero_grad()
        loss.backward()
        dopt.step()
        if eopt is not None:
            eopt.step()
        else:  # row-wise adagrad (hetgmp's rule) on touched rows
            with torch.no_grad():
                gr = emb.weight.grad
                r = gr.abs().sum(1).nonzero().reshape(-1)
                acc[r] += gr[r].pow(2).mean(1)
                emb.weight[r] -= a.lr * gr[r] / (acc[r].sqrt() + 1e-10)[:, None]
        losses.append(float(loss.detach()) / (len(idx) if a.loss == "sum" else 1))
with torch.no_grad():
    s = (
        torch.cat([forward(Xte[i : i + 8192]) for i in range(0, Xte.shape[0], 8192)])
        .reshape(-1)
        .numpy()
    )


def roc_auc_score(y, sc):  # Mann-Whitney U with average ranks for ties
    o = np.argsort(sc, kind="mergesort")
    ss = sc[o]
    r = np.empty(len(sc))
    i = 0
    while i < len(ss):
        j = i
        while j + 1 < len(ss) and ss[j + 1] == ss[i]:
            j += 1
        r[o[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    npos = y.sum()
    nneg = len(y) - npos
    return (r[y].sum() - npos * (npos + 1) / 2) / (npos * nneg)


auc = float(roc_auc_score(yte > 0.5, s.astype(np.float64)))
res = dict(
    vars(a),
    auc=auc,
    train_loss_last100=float(np.mean(losses[-100:])),
    secs=time.time() - t0,
    emb_norm_mean=float(emb.weight.norm(dim=1).mean()),
)
print(json.dumps(res))
if a.out:
    json.dump(res, open(a.out, "w"))
