"""The host tier's per-step residency work, timed on the CPU (issue 33; results:
bench/results/host_tier_startup_cpu.md): a table of ``--rows`` rows (dim 1: a decision's cost
does not depend on the row width, only the copies do), a cache of ``--budget`` of it, and
batches of Zipf-like ids; each step is the one-rank step's tier calls (``lookup`` of the
batch, ``updated``, with the next batch ``expect``-ed and staged as the trainer does). Uses
the tier's public calls only, so it runs on the code before and after a change alike::

    PYTHONPATH=$PWD python bench/host_tier_decide.py [--rows 33800000] [--budget 0.10]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.tiered import TieredRows


def batches(rows: int, batch: int, fields: int, steps: int, seed: int) -> list[torch.Tensor]:
    """``[batch, fields]`` ids: Zipf(1.1) ranks scattered over the table by a fixed hash."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        r = rng.zipf(1.1, (batch, fields)).astype(np.int64) % rows
        out.append(torch.from_numpy((r * 2654435761) % rows))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=33_800_000)
    ap.add_argument("--budget", type=float, default=0.10)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--fields", type=int, default=26)
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    n, budget = a.rows, int(a.budget * a.rows)
    warm = batches(n, a.batch, a.fields, 4, seed=0)
    counts = torch.bincount(torch.cat(warm).reshape(-1), minlength=n)
    opt = SparseOptimizer("adagrad", 0.01, 1e-10, 0.0, "torch")
    cpu = torch.device("cpu")
    t0 = time.perf_counter()
    tier = TieredRows(torch.zeros(n, 1), torch.zeros(n), device=cpu, budget=budget, opt=opt,
                      counts=counts, adopt=True)  # fmt: skip
    print(f"rows {n} cache slots {budget} setup {time.perf_counter() - t0:.1f} s")
    todo = batches(n, a.batch, a.fields, a.steps + 1, seed=1)
    times: list[float] = []
    parts = {name: _timed(obj, attr) for name, obj, attr in (
        ("per decision (_decide)", tier, "_decide"),  # (exists before and after a change)
        ("  of which the row copies (mover.run)", tier.mover, "run"),
        ("per lookup (the device map's slots of the batch)", tier, "lookup"),
        ("per stage_next (dedup of the next batch + its decision)", tier, "stage_next"),
    )}  # fmt: skip
    for i in range(a.steps):  # (the one-rank step's order: expect t+1, look t up, stage t+1)
        tier.expect(todo[i + 1])
        t = time.perf_counter()
        tier.lookup(todo[i])
        tier.stage_next()
        tier.updated()
        times.append(time.perf_counter() - t)
    c = tier.counters
    print(f"steps {a.steps} batch {a.batch}x{a.fields} hits {c.hits} misses {c.misses} "
          f"ahead {c.ahead}")  # fmt: skip
    for name, xs in (("per step (lookup + stage_next + updated)", times[2:]),
                     *((k, v[3:]) for k, v in parts.items())):  # fmt: skip
        ms = sorted(1e3 * x for x in xs)  # (the first steps: the cache's first misses)
        print(f"{name} ms: median {statistics.median(ms):.1f} min {ms[0]:.1f} "
              f"max {ms[-1]:.1f}")  # fmt: skip


def _timed(obj: object, attr: str) -> list[float]:
    """Wrap ``obj.attr`` (a method) so that each call's wall time is appended to the list
    returned."""
    real, out = getattr(obj, attr), []

    def timed(*args: object, **kw: object) -> object:
        t = time.perf_counter()
        got = real(*args, **kw)
        out.append(time.perf_counter() - t)
        return got

    setattr(obj, attr, timed)
    return out


if __name__ == "__main__":
    main()
