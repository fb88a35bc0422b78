#!/usr/bin/env python
"""How many rows one global step updates more than ``--bound`` times, a diagnosis for issue 30::

    python bench/hot_rows.py --data DIR --global-batch 16384 131072 --bound 100 [--steps 20]
    python bench/hot_rows.py --data DIR --plan part.npz --batch-size 8192 --bound 100


Why: reading the next batch's rows one step ahead (``hetgmp.embedding.padded.ahead.ENABLED``)
misses the updates of the step in flight, and a row updated more than ``--bound`` times by one
step is then read beyond the bound (the reason it is off). If those rows are few, they can be
kept in sync another way (replicated, their gradient summed with the dense layers') while every
other row is read ahead within the bound. This counts, over ``--steps`` random global batches
of the training split: the distinct rows per step, the rows with more than ``bound``
occurrences in a step (mean, max, and over all the steps seen: their union), the share of
all occurrences they hold, and the bytes of their float32 gradient at ``--dim``. Writes a
Markdown table to stdout (and ``--out`` when given).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make `hetgmp` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetgmp.data.format import open_dataset  # noqa: E402


def hot_rows(ids: np.ndarray, bound: int) -> tuple[int, np.ndarray, int, int]:
    """(distinct rows, the rows with more than ``bound`` occurrences, their occurrences, all
    occurrences) of one step's ids."""
    u, c = np.unique(ids, return_counts=True)
    hot = c > bound
    return int(u.size), u[hot], int(c[hot].sum()), int(c.sum())


def table(x: np.ndarray, batches: list[int], bound: int, steps: int, dim: int, seed: int) -> str:
    order = np.random.default_rng(seed).permutation(x.shape[0])
    lines = [
        "| global batch | steps | distinct rows / step | rows > bound / step (max) | union over steps "
        "| their share of occurrences | their gradient (float32) |",
        "|---|---|---|---|---|---|---|",
    ]
    for gb in batches:
        k = min(steps, x.shape[0] // gb)
        if k == 0:
            lines.append(f"| {gb} | 0 (the split has {x.shape[0]} samples) | | | | | |")
            continue
        stats = [hot_rows(x[order[s * gb : (s + 1) * gb]].ravel(), bound) for s in range(k)]
        n_hot = np.array([h.size for _, h, _, _ in stats])
        union = np.unique(np.concatenate([h for _, h, _, _ in stats]))
        share = sum(o for _, _, o, _ in stats) / max(1, sum(a for _, _, _, a in stats))
        kib = n_hot.max() * dim * 4 / 1024
        distinct = np.mean([d for d, _, _, _ in stats])
        lines.append(
            f"| {gb} | {k} | {distinct:.0f} | {n_hot.mean():.0f} ({n_hot.max()}) | {union.size} "
            f"| {share:.1%} | {kib:.0f} KiB at dim {dim} |"
        )
    return "\n".join(lines)


def plan_steps(
    x: np.ndarray, plan_path: Path, batch_size: int, steps: int, seed: int
) -> list[list[np.ndarray]]:
    """Training's first ``steps`` global steps under a plan: per step, each rank's batch ids."""
    from hetgmp.data.loader import BatchLoader  # (the CLI's own order)
    from hetgmp.partition.plan import load_plan

    plan = load_plan(plan_path)
    w = int(plan.data_partition.max()) + 1
    orders = []
    for r in range(w):
        idx = plan.samples_of(r)
        loader = BatchLoader(_Split(x), batch_size, indices=idx, shuffle=True, seed=seed, epoch=0)
        orders.append(np.asarray(loader.order))
    k = min(steps, min(o.size for o in orders) // batch_size)
    return [[x[o[s * batch_size : (s + 1) * batch_size]].ravel() for o in orders] for s in range(k)]


class _Split:
    """The little of a split that BatchLoader reads for its order (its length)."""

    def __init__(self, x: np.ndarray) -> None:
        self.sparse = x

    def __len__(self) -> int:
        return int(self.sparse.shape[0])


def plan_table(steps: list[list[np.ndarray]], bound: int, dim: int) -> str:
    """Global counts over the ranks' batches, and per rank the rows over ``bound / (2 w)``."""
    w = len(steps[0])
    h = max(1, bound // (2 * w))
    glob = [hot_rows(np.concatenate(parts), bound) for parts in steps]
    n_hot = np.array([g[1].size for g in glob])
    share = sum(g[2] for g in glob) / max(1, sum(g[3] for g in glob))
    local = np.array([[hot_rows(part, h)[1].size for part in parts] for parts in steps])
    return "\n".join([
        f"| steps | ranks | rows > {bound} / global step (max) | their share | their gradient "
        f"| rows > h = {h} in one rank's batch / step (max) |",
        "|---|---|---|---|---|---|",
        f"| {len(steps)} | {w} | {n_hot.mean():.0f} ({n_hot.max()}) | {share:.1%} "
        f"| {n_hot.max() * dim * 4 / 1024:.0f} KiB | {local.mean():.0f} ({local.max()}) |",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a data set directory")
    p.add_argument("--global-batch", type=int, nargs="+", default=[16384, 131072],
                   help="samples per global step (all ranks together)")  # fmt: skip
    p.add_argument("--bound", type=int, default=100, help="the staleness bound (--bound)")
    p.add_argument("--steps", type=int, default=20, help="random global batches to count")
    p.add_argument("--dim", type=int, default=128, help="embedding dimension (bytes column)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="also write the report here")
    p.add_argument("--plan", type=Path, default=None, help="a plan: training's own batches")
    p.add_argument("--batch-size", type=int, default=8192, help="per rank (with --plan)")
    a = p.parse_args(argv)
    ds = open_dataset(a.data)
    x = np.asarray(ds.train.sparse)
    head = [
        f"# Rows updated more than --bound {a.bound} times in one global step",
        "",
        f"data {a.data} ({x.shape[0]} training samples, {x.shape[1]} fields, "
        f"{ds.meta.num_embeddings} rows); machine {platform.node()}; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"command: python bench/hot_rows.py --data {a.data} --global-batch "
        f"{' '.join(map(str, a.global_batch))} --bound {a.bound} --steps {a.steps}",
        "",
    ]
    if a.plan is not None:
        steps = plan_steps(x, a.plan, a.batch_size, a.steps, a.seed)
        head[3] = (f"command: python bench/hot_rows.py --data {a.data} --plan {a.plan} "
                   f"--batch-size {a.batch_size} --bound {a.bound} --steps {a.steps}")  # fmt: skip
        body = plan_table(steps, a.bound, a.dim)
    else:
        body = table(x, a.global_batch, a.bound, a.steps, a.dim, a.seed)
    report = "\n".join(head) + body + "\n"
    print(report)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
