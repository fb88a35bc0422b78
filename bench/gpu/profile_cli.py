"""Where the CLI's training step spends GPU time: ``examples/hetuctr.py`` under torch.profiler.

    python bench/gpu/profile_cli.py --out prof.txt -- --dataset DIR --device cuda --iter 40 ...

Everything after ``--`` goes to the CLI unchanged (its defaults are the user's). Writes the
kernels sorted by total GPU time, the share of the profiled wall time the GPU was busy, and the
top CPU-side operators; a diagnosis (the figures that count are the CLI's own samples/s).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from hetgmp.train.cli import main as cli_main


def _summary(prof: profile, wall_s: float, rows: int) -> str:
    events = prof.key_averages()
    dev = [e for e in events if getattr(e, "self_device_time_total", 0) > 0]
    busy_us = sum(e.self_device_time_total for e in dev)
    lines = [
        f"profiled wall {wall_s:.3f} s, GPU busy (sum of kernel times) {busy_us / 1e6:.3f} s "
        f"= {100 * busy_us / 1e6 / max(wall_s, 1e-9):.1f} % (data generation and start-up "
        "included: compare shares, not the total)",
        "",
        events.table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=70),
        events.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=70),
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the tables go here")
    ap.add_argument("--rows", type=int, default=30)
    args, rest = ap.parse_known_args()
    cli_args = rest[1:] if rest[:1] == ["--"] else rest
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        rc = cli_main(cli_args)
    text = _summary(prof, time.perf_counter() - t0, args.rows)
    args.out.write_text(text)
    print(text[:6000])
    return rc


if __name__ == "__main__":
    sys.exit(main())
