"""Ranks with unequal batch counts in the multi-rank whole step, under torchrun.

``python -m torch.distributed.run --standalone --nproc_per_node 2 tests/gpu_uneven_check.py
DIR``: a plan that gives rank 0 ~60 % of the samples, so that each epoch rank 1 trains a
partial batch while rank 0's are full, then has none for several steps (empty batches) while
rank 0 trains on; row-wise Adagrad (the split owner update, ``padded.owner_update.OWN_SPLIT``)
at bound 0 and 100, and SGD. The captured whole step must train as the eager padded step does,
without the stepper refusing a step (it raises where a step would leave the padded path after
the split update applied own rows) and without a hang. Rank 0 prints ``UNEVEN CHECK OK``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
from gpu_whole_step_check import assert_same_state, checked, run

from hetgmp.comm.collectives import barrier
from hetgmp.data.format import open_dataset
from hetgmp.partition.plan import Plan, save_plan


def uneven_plan(root: Path) -> Path:
    """Rank 0 ~60 % of the samples; random owners; each rank's other rows as its mirrors."""
    ds = open_dataset(str(root))
    rng = np.random.default_rng(7)
    n, r = len(ds.train), ds.meta.num_embeddings
    dp = (rng.random(n) < 0.4).astype(np.int32)
    ep = rng.integers(0, 2, r).astype(np.int32)
    mirrors = [rng.permutation(np.flatnonzero(ep != w)).astype(np.int64) for w in range(2)]
    path = root.parent / "uneven_part.npz"
    save_plan(Plan(dp, ep, mirrors, {"dataset_fingerprint": ds.fingerprint}), path)
    return path


def compare(env: Any, root: Path) -> None:
    if env.rank == 0:
        uneven_plan(root)
    barrier(env)
    plan = str(root.parent / "uneven_part.npz")
    for opt, bound in (("adagrad", 0), ("adagrad", 100), ("sgd", 100)):
        kw = dict(optimizer=opt, bound=bound, lr=0.05 if opt == "adagrad" else 5.0, partition=plan)
        g = run(env, root, True, **kw)
        e = run(env, root, False, **kw)
        assert g["replays"] > 5, g["replays"]
        assert_same_state(g, e)
        print(f"rank {env.rank} {opt} bound {bound}: graph == eager ({g['replays']} replays)")


if __name__ == "__main__":
    sys.exit(checked(compare, "UNEVEN CHECK OK"))
