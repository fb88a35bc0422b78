"""How close a small embedding + MLP model gets to a generated data set's ``best_auc`` in one epoch.

Evidence that the planted labels are learnable (not noise on ids seen once): a WDL-style model
(first-order per-id weights + 8-dim embeddings -> MLP, with the dense features) trained for one
epoch with Adam / SparseAdam on the train split, scored with the exact test AUC. Reads batches
through :class:`hetgmp.data.loader.BatchLoader`. Prints one JSON line and appends it to
``bench/results/generate_learnability.json``.

Usage: ``python bench/bench_generate_learnability.py DATASET_DIR [--batch-size 4096]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hetgmp.data.format import open_dataset
from hetgmp.data.loader import BatchLoader
from hetgmp.metrics import roc_auc

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


class SmallWDL(nn.Module):
    def __init__(self, rows: int, fields: int, dense: int, dim: int = 8) -> None:
        super().__init__()
        self.wide = nn.Embedding(rows, 1, sparse=True)
        self.emb = nn.Embedding(rows, dim, sparse=True)
        nn.init.zeros_(self.wide.weight)
        nn.init.normal_(self.emb.weight, std=0.01)
        self.mlp = nn.Sequential(
            nn.Linear(fields * dim + dense, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
            nn.Linear(64, 1),
        )  # fmt: skip

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        wide = self.wide(ids).sum(dim=(1, 2))
        deep = self.mlp(torch.cat([self.emb(ids).flatten(1), dense], dim=1)).squeeze(1)
        return wide + deep


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset", type=Path)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.manual_seed(a.seed)
    ds = open_dataset(a.dataset)
    m = ds.meta
    model = SmallWDL(m.num_embeddings, m.num_fields, m.num_dense)
    sparse_opt = torch.optim.SparseAdam(
        list(model.wide.parameters()) + list(model.emb.parameters()), lr=a.lr
    )
    dense_opt = torch.optim.Adam(model.mlp.parameters(), lr=a.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    t0 = time.perf_counter()
    for b in BatchLoader(ds.train, a.batch_size, shuffle=True, seed=a.seed):
        logits = model(torch.from_numpy(b.sparse), torch.from_numpy(b.dense))
        loss = loss_fn(logits, torch.from_numpy(b.labels).squeeze(1))
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
    train_s = time.perf_counter() - t0
    model.eval()
    scores = []
    with torch.no_grad():
        for b in BatchLoader(ds.test, 65536):
            scores.append(model(torch.from_numpy(b.sparse), torch.from_numpy(b.dense)).numpy())
    auc = roc_auc(np.asarray(ds.test.labels), np.concatenate(scores))
    rec = {
        "dataset": str(a.dataset), "train_samples": m.splits["train"], "rows": m.num_embeddings,
        "best_auc": m.best_auc, "one_epoch_auc": auc, "gap": (m.best_auc or 0) - auc,
        "train_s": round(train_s, 1), "batch_size": a.batch_size, "lr": a.lr,
        "command": "python " + " ".join(sys.argv), "machine": platform.node(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }  # fmt: skip
    print(json.dumps(rec))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "generate_learnability.json"
    recs = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps([*recs, rec], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
