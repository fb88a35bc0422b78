"""How much of a step's communication runs under compute, from a Chrome trace of GPU kernels
(``bench/gpu/profile_steps.py --trace``), a diagnosis::

    python bench/gpu/trace_overlap.py trace_RANK.json.gz [more traces]

Per trace: the window from its first to its last GPU event, the time collectives run
(NCCL kernels), the part of it during which another kernel runs too (hidden under compute),
and the time the GPU runs nothing (idle: launch gaps, waits for the host). Intervals are merged
per class, so kernels that overlap each other count once.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Interval = tuple[float, float]
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def merged(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted disjoint intervals."""
    out: list[Interval] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def intersection(x: list[Interval], y: list[Interval]) -> float:
    """Total length of the intersection of two sorted disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(0.0, hi - lo)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def is_collective(name: str) -> bool:
    return name.startswith(("ncclDevKernel", "ncclKernel"))


def overlap(events: list[dict[str, Any]]) -> dict[str, float]:
    """``window_us``, ``comm_us``, ``hidden_us`` (collectives while another kernel runs),
    ``hidden_share``, ``idle_us`` of a trace's GPU events (Chrome ``X`` events)."""
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    if not gpu:
        return {"window_us": 0.0, "comm_us": 0.0, "hidden_us": 0.0, "hidden_share": 0.0,
                "idle_us": 0.0}  # fmt: skip
    span = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in gpu]
    comm = merged(s for s, e in zip(span, gpu, strict=True) if is_collective(e["name"]))
    other = merged(s for s, e in zip(span, gpu, strict=True) if not is_collective(e["name"]))
    window = max(b for _, b in span) - min(a for a, _ in span)
    comm_us, hidden = length(comm), intersection(comm, other)
    return {
        "window_us": window, "comm_us": comm_us, "hidden_us": hidden,
        "hidden_share": hidden / comm_us if comm_us else 0.0,
        "idle_us": window - length(merged(span)),
    }  # fmt: skip


def read_trace(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for p in argv:
        o = overlap(read_trace(Path(p)))
        print(f"{p}: window {o['window_us'] / 1e3:.3f} ms, collectives {o['comm_us']:.0f} us, "
              f"hidden under compute {o['hidden_share']:.0%}, GPU idle {o['idle_us']:.0f} us")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
