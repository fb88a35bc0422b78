"""Which CPU thread settings a one-process ``hetgmp train`` should default to (issue 32 item 3).

A new user's ``--threads 0`` (the machine's cores) ran at 3.6-4.5k samples/s on the shared
2-core box against 15.8-20k with ``--threads 1``. This script runs the README's one-process
command (the default data set, a fixed number of steps) under each setting of torch's
intra-op threads and the reader's prefetch thread, **interleaved round by round** so that
every setting sees the same share of the box's changing load (other engineers' tests), and
records the load average next to each run. Speeds are only compared within one run of it.

    PYTHONPATH=$PWD python bench/bench_threads.py --rounds 3 --iter 150 \
        --out bench/results/threads_cpu2.md

Settings: ``--threads N`` (torch intra-op threads; 0 is the default rule under test) and
``--prefetch-batches`` (4: a background thread gathers batches ahead, 0: in the training
thread). Each run is a fresh process, as a user's is; the speed is the results file's
``speed`` (global samples/s after the warm-up steps).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SETTINGS = {  # name -> extra flags
    "default (--threads 0)": [],
    "--threads 1": ["--threads", "1"],
    "--threads 2": ["--threads", "2"],
    "--threads 1 --prefetch-batches 0": ["--threads", "1", "--prefetch-batches", "0"],
    "--threads 2 --prefetch-batches 0": ["--threads", "2", "--prefetch-batches", "0"],
}


def one_run(flags: list[str], iters: int, tmp: Path) -> tuple[float, str]:
    """(samples/s, the threads line of the log) of one fresh training process."""
    out = tmp / "res.json"
    cmd = [sys.executable, "-m", "hetgmp", "train", "--iter", str(iters), "--no-val",
           "--device", "cpu", "--no-progress", "--output", str(out), *flags]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "threads:" in ln]
    return float(json.loads(out.read_text())["speed"]), (lines[0] if lines else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iter", type=int, default=150, help="steps per run (batch 1024)")
    ap.add_argument("--out", type=Path, default=None, help="markdown report (and .json)")
    args = ap.parse_args()
    speeds: dict[str, list[float]] = {k: [] for k in SETTINGS}
    loads: list[float] = []
    picked = ""
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            # (a rotating start: no setting always runs right after the same neighbour)
            names = list(SETTINGS)[r % len(SETTINGS) :] + list(SETTINGS)[: r % len(SETTINGS)]
            for name in names:
                loads.append(os.getloadavg()[0])
                s, line = one_run(SETTINGS[name], args.iter, Path(d))
                speeds[name].append(s)
                picked = line if name.startswith("default") and line else picked
                print(f"round {r} {name:36s} {s:9.0f} samples/s  load {loads[-1]:.2f}", flush=True)
    ref = statistics.median(speeds["--threads 1"])
    rows = [
        f"| {n} | {statistics.median(v):.0f} | {min(v):.0f}-{max(v):.0f} | "
        f"{statistics.median(v) / ref:.2f} |"
        for n, v in speeds.items()
    ]
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    machine = f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus"
    text = "\n".join([
        f"# One-process CPU thread settings ({when})", "",
        f"Machine: {machine}; load average during the runs {min(loads):.2f}-{max(loads):.2f} "
        f"(shared with other engineers' tests). `python bench/bench_threads.py --rounds "
        f"{args.rounds} --iter {args.iter}`: the default data set, batch 1024, {args.iter} "
        "steps per fresh process, settings interleaved round by round.", "",
        "| setting | median samples/s | range | vs --threads 1 |", "|---|---|---|---|", *rows, "",
        f"The default's log line: `{picked.strip()}`",
    ])  # fmt: skip
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        record = {"date": when, "machine": machine, "loads": loads, "speeds": speeds}
        args.out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
