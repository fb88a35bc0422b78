"""Where the CLI's training step spends GPU time: ``examples/hetuctr.py`` under torch.profiler.

    python bench/gpu/profile_cli.py --out prof.txt -- --dataset DIR --device cuda --iter 40 ...

Everything after ``--`` goes to the CLI unchanged (its defaults are the user's). Writes the
kernels sorted by total GPU time, the share of the profiled wall time the GPU was busy, and the
top CPU-side operators; a diagnosis (the figures that count are the CLI's own samples/s).
``--window A:B`` adds the GPU time *per training step* of every kernel launched between the
A-th and the B-th step (the steps' ``_LocalLookup`` / lookup markers), which leaves start-up
(table initialisation) and evaluation out: run it with ``--no-cuda-graphs`` so each kernel is
seen (a replayed graph is one opaque launch).
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


def _window(prof: profile, spec: str, marker: str) -> str:
    """Per-step GPU time of each kernel launched between the A-th and B-th ``marker`` event."""
    a, b = (int(x) for x in spec.split(":"))
    marks = sorted(e.time_range.start for e in prof.events() if e.name == marker)
    if len(marks) < b + 1 or not 0 <= a < b:
        return f"window {spec}: only {len(marks)} '{marker}' events (steps) were seen"
    t0, t1, steps = marks[a], marks[b], b - a
    per: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type.name != "CUDA" or not t0 <= e.time_range.start < t1:
            continue
        per.setdefault(e.name, []).append(e.time_range.elapsed_us())
    busy = sum(sum(v) for v in per.values()) / steps
    lines = [
        f"steps {a}..{b} ({steps}): wall {(t1 - t0) / steps:.1f} us/step (host-paced when "
        f"eager), GPU busy {busy:.1f} us/step",
        f"{'us/step':>9} {'calls/step':>10}  kernel",
    ]
    for name, d in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"{sum(d) / steps:9.2f} {len(d) / steps:10.2f}  {name[:110]}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the tables go here")
    ap.add_argument("--rows", type=int, default=30)
    ap.add_argument("--window", default="", help="A:B: per-step GPU time of steps A..B")
    ap.add_argument("--marker", default="_LocalLookup", help="the op that marks each step")
    args, rest = ap.parse_known_args()
    cli_args = rest[1:] if rest[:1] == ["--"] else rest
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        rc = cli_main(cli_args)
    text = _summary(prof, time.perf_counter() - t0, args.rows)
    if args.window:
        text = _window(prof, args.window, args.marker) + "\n\n" + text
    args.out.write_text(text)
    print(text[:6000])
    return rc


if __name__ == "__main__":
    sys.exit(main())
