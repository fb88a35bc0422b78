"""The host tier's start-up phases and a few residency decisions, timed on the CPU (issue 33;
results: bench/results/host_tier_startup_cpu.md). Calls the phases one by one, so it runs on
the code before and after the start-up fix alike::

    PYTHONPATH=$PWD python bench/host_tier_phases.py DATASET [--dim 128] [--budget 0.10]
"""

from __future__ import annotations

import argparse
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hetgmp.data.format import open_dataset
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.store import RowStore
from hetgmp.embedding.tier_setup import tier_rows_of
from hetgmp.embedding.tiered import TieredRows, hottest_first
from hetgmp.train.tier_warm import warm_counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--budget", type=float, default=0.10)
    ap.add_argument("--batch", type=int, default=8192)
    a = ap.parse_args()
    ds = open_dataset(a.dataset)
    n = ds.meta.num_embeddings
    secs: dict[str, float] = {}

    def tm(name: str, f: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        r = f()
        secs[name] = time.perf_counter() - t
        return r

    cfg = types.SimpleNamespace(rows_on="host", cache_warm="counts", cache_budget=a.budget)
    counts = torch.from_numpy(tm("count (warm_counts)", lambda: warm_counts(cfg, ds)))  # type: ignore[arg-type]
    opt = SparseOptimizer("adagrad", 0.01, 1e-10, 0.0, "torch")
    kw: dict[str, Any] = dict(rank=0, world=1, owner=np.zeros(n, np.int8), opt=opt, seed=0,
                              mirrors=np.zeros(0, np.int64), init_scale=0.01)  # fmt: skip
    cpu = torch.device("cpu")
    store = tm("init (RowStore in host memory)", lambda: RowStore(n, a.dim, device=cpu, **kw))
    tm("hottest_first alone", lambda: hottest_first(counts, n))
    tier = tm("tier (order + residents' copy)",
              lambda: tier_rows_of(store, opt, cpu, a.budget, counts))  # fmt: skip
    sp = np.asarray(ds.train.sparse[: a.batch * 6]).astype(np.int64)
    batches = [torch.from_numpy(sp[i * a.batch : (i + 1) * a.batch]) for i in range(6)]

    def steps(t: TieredRows) -> None:
        for b in batches:
            t.lookup(b)
            t.updated()

    tm("6 lookups, warm cache", lambda: steps(tier))
    cold = TieredRows(store.weight, store.opt_state, device=cpu, budget=tier.budget, opt=opt,
                      adopt=True)  # fmt: skip
    tm("6 lookups, cold cache", lambda: steps(cold))
    print(f"rows {n} dim {a.dim} cache {tier.budget} cold misses {cold.counters.misses}")
    for k, v in secs.items():
        print(f"{k:34s} {v:8.2f} s")


if __name__ == "__main__":
    main()
