"""Summarize a py-spy ``--format raw`` recording (``--threads``, ``--subprocesses``): for each
rank process and thread, the share of samples inside chosen Python functions (inclusive) and the
top leaf frames, restricted to samples under ``--under`` (default: the training loop).

    python bench/spy_summary.py async_spy.txt [--under AsyncLoop._train] [--top 25]

A diagnosis tool: py-spy samples wall time (``--idle``), so a thread waiting on a socket or a
CUDA synchronization counts where it waits.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from pathlib import Path

_FRAME = re.compile(r"^(?P<fn>[^ ]+) \((?P<where>[^)]*)\)$")


def parse(path: Path) -> dict[tuple[str, str], Counter[tuple[str, ...]]]:
    """``{(process, thread): Counter(stack of function names -> samples)}``, root first."""
    out: dict[tuple[str, str], Counter[tuple[str, ...]]] = defaultdict(Counter)
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        parts = stack.split(";")
        procs = [p for p in parts if p.startswith("process ")]
        threads = [p for p in parts if p.startswith("thread ")]
        if not procs or not threads:
            continue
        proc = procs[-1].split(":", 1)[0]
        if " examples/" not in procs[-1] and "hetuctr" not in procs[-1]:
            proc += " (launcher)"
        frames = []
        for p in parts:
            if p.startswith(("process ", "thread ")):
                continue
            m = _FRAME.match(p)
            frames.append(m["fn"] if m else p)
        out[(proc, threads[-1])][tuple(frames)] += int(n)
    return out


def summarize(stacks: Counter[tuple[str, ...]], under: str, top: int) -> list[str]:
    picked = Counter({s: n for s, n in stacks.items() if not under or under in s})
    total = sum(picked.values())
    if not total:
        return []
    incl: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    for s, n in picked.items():
        i = s.index(under) if under in s else 0
        for fn in set(s[i + 1 :]):
            incl[fn] += n
        leaf[s[-1] if s else "?"] += n
    lines = [f"  {total} samples under {under or 'everything'}"]
    lines += [f"    {100 * n / total:5.1f}%  {fn}" for fn, n in incl.most_common(top)]
    lines += ["  leaves:"]
    lines += [f"    {100 * n / total:5.1f}%  {fn}" for fn, n in leaf.most_common(top // 2)]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw", type=Path)
    p.add_argument("--under", default="AsyncLoop._train", help="'' for whole threads")
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args()
    for (proc, thread), stacks in sorted(parse(a.raw).items()):
        if "launcher" in proc:
            continue
        under = a.under if "MainThread" in thread else ""
        body = summarize(stacks, under, a.top if "MainThread" in thread else 8)
        if body:
            print(f"{proc} {thread}: {sum(stacks.values())} samples")
            print("\n".join(body))


if __name__ == "__main__":
    main()
