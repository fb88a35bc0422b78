#!/usr/bin/env python
"""How many rows one global step updates more than ``--bound`` times, a diagnosis for issue 30::

    python bench/hot_rows.py --data DIR --global-batch 16384 131072 --bound 100 [--steps 20]

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
    report = "\n".join(head) + table(x, a.global_batch, a.bound, a.steps, a.dim, a.seed) + "\n"
    print(report)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
