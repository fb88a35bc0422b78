"""The batch plan's five launches timed one by one (diagnosis): where the plan's time goes at
batch 8192 and 65536 per GPU (``hetgmp/embedding/kernels/prep.py``; at 65536 on 2 H100s the
plan alone takes ~207 us and leaving it out of the 2-GPU step gains ~6 %,
``bench/results/gpu/ceiling_s23/``). Same inputs as ``prep_kernels.py`` (Criteo Kaggle's
shape, Zipf-like ids, rank 0's block map). Each launch is bracketed by CUDA events on the
current stream, eager, after warm-up calls; medians over ``--reps`` plans.

    python bench/gpu/prep_kernel_split.py [--out DIR]
    TRITON_INTERPRET=1 python bench/gpu/prep_kernel_split.py --device cpu --card-scale 1e-4 \
        --batches 64 --reps 2   # (a smoke run: host times, meaningless)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.gpu.prep_kernels import card_rows, maps, plan_args, zipf_ids  # noqa: E402
from bench.gpu.timing import machine_info  # noqa: E402
from hetgmp.embedding.batch import BatchPlanner  # noqa: E402
from hetgmp.embedding.kernels import prep as prep_kernels  # noqa: E402


class LaunchTimer:
    """Wraps ``prep.launch``: each launch's time, by kernel name, while ``on``."""

    def __init__(self, dev: torch.device) -> None:
        self.dev, self.on = dev, False
        self.pending: list[tuple[str, Any, Any]] = []
        self.orig = prep_kernels.launch

    def __call__(self, kernel: Any, grid: Any, args: Any, consts: Any) -> Any:
        if not self.on:
            return self.orig(kernel, grid, args, consts)
        name = getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel))
        if self.dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = self.orig(kernel, grid, args, consts)
            b.record()
        else:
            a = time.perf_counter()
            out = self.orig(kernel, grid, args, consts)
            b = time.perf_counter()
        self.pending.append((name, a, b))
        return out

    def collect(self) -> dict[str, float]:
        """Microseconds per kernel name of the launches since the last collect."""
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
            us = [(n, 1e3 * a.elapsed_time(b)) for n, a, b in self.pending]
        else:
            us = [(n, 1e6 * (b - a)) for n, a, b in self.pending]
        self.pending = []
        out: dict[str, float] = {}
        for n, t in us:
            out[n] = out.get(n, 0.0) + t
        return out


def measure(world: int, batch: int, cards: np.ndarray, reps: int, dev: torch.device) -> dict:
    g = torch.Generator(device=dev).manual_seed(world * 7919 + batch)
    slot_of, block_of = maps(cards, world, g, dev)
    ids = zipf_ids(batch, cards, g, dev)
    planner = BatchPlanner(slot_of, block_of, world, dev, backend="triton")
    timer = LaunchTimer(dev)
    prep_kernels.launch = timer  # type: ignore[assignment]
    try:
        for _ in range(3):  # (warm-up: compiles)
            planner.prepare(ids)
        runs: list[dict[str, float]] = []
        for _ in range(reps):
            timer.on = True
            p = planner.prepare(ids)
            timer.on = False
            runs.append(timer.collect())
    finally:
        prep_kernels.launch = timer.orig  # type: ignore[assignment]
    names = list(runs[0])
    med = {n: statistics.median(r[n] for r in runs) for n in names}
    return {"world": world, "batch": batch, "n": ids.numel(), "distinct": int(p.blocks.sum()),
            "us": med, "us_sum": sum(med.values())}  # fmt: skip


def main() -> int:
    a = plan_args(__doc__ or "", "2", 30).parse_args()
    dev = torch.device(a.device)
    cards = card_rows(a.card_scale)
    recs = [
        measure(int(w), int(b), cards, a.reps, dev)
        for w in a.worlds.split(",") for b in a.batches.split(",")
    ]  # fmt: skip
    lines = ["| world | batch | n | distinct | " + " | ".join(recs[0]["us"]) + " | sum |",
             "|---" * (len(recs[0]["us"]) + 5) + "|"]  # fmt: skip
    for r in recs:
        cells = " | ".join(f"{v:.1f}" for v in r["us"].values())
        lines.append(f"| {r['world']} | {r['batch']} | {r['n']:,} | {r['distinct']:,} | {cells} | "
                     f"{r['us_sum']:.1f} |")  # fmt: skip
    table = "\n".join(lines)
    print(table)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        info = machine_info(dev)
        (out / "prep_kernel_split.json").write_text(json.dumps({"machine": info, "records": recs}))
        (out / "prep_kernel_split.md").write_text(
            f"# The plan's launches one by one (bench/gpu/prep_kernel_split.py)\n\n{info}\n\n"
            f"{table}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
