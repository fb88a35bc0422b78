"""Read a chrome trace of ``bench/gpu/async_trace.py --dump`` (a diagnosis, not a figure): per
thread, where the host time of a training step goes, in the middle half of the run.

    python bench/trace_threads.py DIR/trace_rank0.json.gz [OTHER.json.gz ...] [--top 15]

For each thread: the time per step inside top-level profiled ops (an op not nested in another
op of the same thread) by name, and the rest of the window (``(outside ops)``: Python, the GIL,
socket waits). A step is one dense optimizer step (the ``Optimizer.step#...`` annotation) of the
thread that takes the most of them. Several traces print side by side (e.g. lockstep and async),
so the same op's time per step can be compared.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any


def load(path: Path) -> list[dict[str, Any]]:
    """The complete events (``ph == "X"``) of a chrome trace, plain or gzipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]


def per_thread(events: list[dict[str, Any]]) -> tuple[int, dict[Any, Counter[str]], float]:
    """(steps in the window, {tid: Counter(op -> us of top-level time)}, window us)."""
    marks = [e for e in events if str(e["name"]).startswith("Optimizer.step#")]
    if not marks:
        raise SystemExit("no Optimizer.step# annotations: not a training trace?")
    main = Counter(e["tid"] for e in marks).most_common(1)[0][0]
    ts = sorted(e["ts"] for e in marks if e["tid"] == main)
    lo, hi = ts[len(ts) // 4], ts[3 * len(ts) // 4]
    steps = 3 * len(ts) // 4 - len(ts) // 4
    by: dict[Any, Counter[str]] = {}
    host = [e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver",
                                                  "user_annotation")]  # fmt: skip
    for tid in sorted({e["tid"] for e in host}, key=str):
        mine = sorted((e for e in host if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"]))
        c: Counter[str] = Counter()
        end = -1.0
        for e in mine:
            t0, t1 = max(e["ts"], lo), min(e["ts"] + e["dur"], hi)
            if e["ts"] < end or t1 <= t0:  # (nested in the last top-level op, or outside)
                continue
            if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer"):
                continue  # (an annotation spanning ops: count the ops)
            c[e["name"]] += t1 - t0
            end = e["ts"] + e["dur"]
        c["(outside ops)"] = (hi - lo) - sum(c.values())
        by[tid] = c
    gpu = sum(min(e["ts"] + e["dur"], hi) - max(e["ts"], lo) for e in events
              if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
              and e["ts"] < hi and e["ts"] + e["dur"] > lo)  # fmt: skip
    by["(GPU)"] = Counter({"kernels and copies": gpu, "(outside ops)": (hi - lo) - gpu})
    return steps, by, hi - lo


def report(path: Path, top: int) -> list[str]:
    steps, by, window = per_thread(load(path))
    out = [f"{path}: {steps} steps in the middle half, {window / steps / 1e3:.2f} ms a step"]
    for tid, c in by.items():
        busy = sum(v for k, v in c.items() if k != "(outside ops)")
        if busy / steps < 50:  # (threads idle in the window: < 50 us of ops a step)
            continue
        out.append(f"  thread {tid}: {busy / steps / 1e3:.2f} ms of ops a step")
        for name, us in c.most_common(top):
            out.append(f"    {us / steps / 1e3:7.3f} ms  {name[:80]}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", type=Path, nargs="+")
    p.add_argument("--top", type=int, default=15)
    a = p.parse_args()
    for path in a.traces:
        print("\n".join(report(path, a.top)), end="\n\n")


if __name__ == "__main__":
    main()
