"""One training step's GPU operations in time, from a Chrome trace of
``bench/gpu/profile_steps.py --trace``, a diagnosis (what ``bench/results/gpu/
scaling_diagnosis/timeline_8192/step45_rank0_timeline.txt`` shows)::

    python bench/gpu/trace_timeline.py trace_w2_0.json.gz [--step N] [--out FILE]

The step is a ``ProfilerStep#N`` range on the GPU (default: the trace's middle one). Prints every
GPU operation that starts inside it: start (us from the step's start), duration (us), stream and
a short kernel name, then the time per kernel name summed over the step, largest first: where a
step's time goes, and which operations wait for which (the chain after backward).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu.trace_overlap import GPU_CATS, read_trace  # noqa: E402

STEP = re.compile(r"ProfilerStep#(\d+)")


def short_name(name: str) -> str:
    """A kernel's name without ``void``, namespaces, template and call arguments
    (``void at::native::foo<...>(...)`` -> ``foo``); memcpy / memset names as they are."""
    s = name.removeprefix("void ").strip()
    cut = min((i for i in (s.find("<"), s.find("(")) if i >= 0), default=len(s))
    return s[:cut].rsplit("::", 1)[-1] or s[:40]


def steps(events: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """``{N: (start, end)}`` of the ``ProfilerStep#N`` ranges the GPU ran (their GPU
    annotations; the CPU ones where the trace has no GPU ones)."""
    out: dict[int, tuple[float, float]] = {}
    for cat in ("gpu_user_annotation", "user_annotation"):
        for e in events:
            m = STEP.fullmatch(str(e.get("name", "")))
            if e.get("cat") == cat and m:
                a, b = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
                n = int(m.group(1))
                lo, hi = out.get(n, (a, b))
                out[n] = (min(lo, a), max(hi, b))
        if out:
            return out
    return out


def timeline(events: list[dict[str, Any]], step: int | None = None) -> str:
    """The step's operations and its time per kernel name (see the module docstring)."""
    ranges = steps(events)
    if not ranges:
        raise SystemExit("trace_timeline: no ProfilerStep#N range in the trace")
    n = step if step is not None else sorted(ranges)[len(ranges) // 2]
    if n not in ranges:
        raise SystemExit(f"trace_timeline: no step {n} (the trace has {sorted(ranges)})")
    t0, t1 = ranges[n]
    ops = sorted(
        (e for e in events if e.get("cat") in GPU_CATS and t0 <= float(e["ts"]) < t1),
        key=lambda e: float(e["ts"]),
    )
    lines = [f"step {n}: {t1 - t0:.1f} us, {len(ops)} GPU operations",
             f"{'start':>8} {'us':>7}  stream  kernel"]  # fmt: skip
    per: dict[str, float] = defaultdict(float)
    for e in ops:
        name = short_name(str(e.get("name", "")))
        dur = float(e.get("dur", 0))
        per[name] += dur
        lines.append(f"{float(e['ts']) - t0:8.1f} {dur:7.1f}  {e.get('tid', '?')!s:>6}  {name}")
    lines += ["", *streams(ops, t0)]
    lines += ["", f"{'us':>8}  kernel (summed over the step)"]
    lines += [f"{us:8.1f}  {name}" for name, us in sorted(per.items(), key=lambda x: -x[1])]
    return "\n".join(lines)


def streams(ops: list[dict[str, Any]], t0: float) -> list[str]:
    """Per stream: operations, busy us, first start and last end (us from the step's start);
    and the GPU's busy time over all streams (the union): how much of the step runs beside
    what."""
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in ops:
        a = float(e["ts"]) - t0
        by[str(e.get("tid", "?"))].append((a, a + float(e.get("dur", 0))))
    out = [f"{'stream':>8} {'ops':>5} {'busy us':>8} {'first':>8} {'last end':>8}"]
    for tid, iv in sorted(by.items(), key=lambda x: -sum(b - a for a, b in x[1])):
        busy = sum(b - a for a, b in iv)
        out.append(f"{tid:>8} {len(iv):5d} {busy:8.1f} {min(a for a, _ in iv):8.1f} "
                   f"{max(b for _, b in iv):8.1f}")  # fmt: skip
    union, end = 0.0, float("-inf")
    for a, b in sorted(x for iv in by.values() for x in iv):
        if b > end:
            union += b - max(a, end)
            end = b
    out.append(f"GPU busy (any stream): {union:.1f} us")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a Chrome trace (.json or .json.gz)")
    ap.add_argument("--step", type=int, default=None, help="N of ProfilerStep#N (default: middle)")
    ap.add_argument("--out", default=None, help="write here as well as to stdout")
    args = ap.parse_args(argv)
    text = timeline(read_trace(Path(args.trace)), args.step)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
