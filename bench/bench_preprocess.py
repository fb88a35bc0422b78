"""Throughput and peak memory of ``hetgmp preprocess criteo`` on a generated Criteo-format TSV.

    .venv/bin/python bench/bench_preprocess.py --lines 3000000 [--workdir /tmp/hetgmp-bench]

Writes a synthetic Criteo TSV (label, 13 ints with empties/negatives, 26 8-hex categoricals with
power-law frequencies and empties) itself, runs the real CLI in a child process and records
wall time, lines/s and the child's peak RSS in ``bench/results/preprocess.{md,json}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

ROOT = Path(__file__).resolve().parents[1]
CARDS = [1460, 583, 1013122, 220260, 305, 24, 12517, 633, 3, 93145, 5683, 835159, 3194, 27,
         14992, 546130, 10, 5652, 2173, 4, 704654, 18, 15, 28618, 105, 14257]  # Kaggle / ~10


def _hex8(v: np.ndarray) -> pa.Array:
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    shifts = np.arange(28, -4, -4, dtype=np.uint32)
    chars = digits[(v[:, None].astype(np.uint32) >> shifts) & 15]
    return pa.array(np.ascontiguousarray(chars).view("S8").ravel(), pa.binary(8)).cast(pa.string())


def write_criteo_tsv(path: Path, lines: int, seed: int, chunk: int = 500_000) -> None:
    rng = np.random.default_rng(seed)
    opts = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    with pa.OSFile(str(path), "wb") as sink:
        done = 0
        while done < lines:
            n = min(chunk, lines - done)
            cols = {"label": pa.array((rng.random(n) < 0.25).astype(np.int8)).cast(pa.string())}
            for i in range(13):
                v = pa.array(rng.geometric(0.05, n) - 3).cast(pa.string())
                cols[f"I{i}"] = pc.if_else(pa.array(rng.random(n) < 0.2), "", v)
            for i, card in enumerate(CARDS):
                ids = (rng.zipf(1.2, n) - 1) % card
                v = _hex8((ids * 2654435761 + i).astype(np.uint64) & 0xFFFFFFFF)
                cols[f"C{i}"] = pc.if_else(pa.array(rng.random(n) < 0.1), "", v)
            pacsv.write_csv(pa.table(cols), sink, opts)
            done += n


def machine() -> dict:
    cpu = ""
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                   if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(),
            "python": platform.python_version(), "platform": platform.platform()}


def _write_results(res: dict, lines: int) -> list[str]:
    """``bench/results/preprocess.{json,md}``; returns the markdown lines."""
    (ROOT / "bench/results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench/results/preprocess.json").write_text(json.dumps(res, indent=2) + "\n")
    md = ["# hetgmp preprocess criteo: throughput and peak memory", "",
          f"- date: {res['date']}", f"- machine: {res['machine']}", f"- command: `{res['command']}`",
          f"- preprocess: `{res['preprocess_command']}`", "",
          "| lines | input MB | wall s | lines/s | MB/s | peak RSS MiB | pass1 s | pass2 s | rows |",
          "|---|---|---|---|---|---|---|---|---|",
          f"| {lines} | {res['input_bytes'] / 1e6:.0f} | {res['preprocess_wall_s']:.1f} | "
          f"{res['lines_per_s']} | {res['mb_per_s']} | {res['peak_rss_mib']} | "
          f"{res['pass_seconds']['pass1']} | {res['pass_seconds']['pass2']} | "
          f"{res['num_embeddings']} |", ""]
    (ROOT / "bench/results/preprocess.md").write_text("\n".join(md))
    return md


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lines", type=int, default=3_000_000)
    ap.add_argument("--min-count", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/hetgmp-bench-preprocess"))
    ap.add_argument("--keep", action=argparse.BooleanOptionalAction, default=False)
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    tsv, out = args.workdir / "criteo.tsv", args.workdir / "out"
    t0 = time.perf_counter()
    write_criteo_tsv(tsv, args.lines, seed=0)
    t_gen = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "hetgmp", "preprocess", "criteo", str(tsv), "--out", str(out),
           "--min-count", str(args.min_count), "--no-progress"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    meta = json.loads((out / "meta.json").read_text())
    size = tsv.stat().st_size
    res = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "command": " ".join(["python", "bench/bench_preprocess.py", "--lines", str(args.lines),
                             "--min-count", str(args.min_count)]),
        "preprocess_command": " ".join(cmd[1:]),
        "lines": args.lines, "input_bytes": size, "generate_s": round(t_gen, 2),
        "preprocess_wall_s": round(wall, 2), "lines_per_s": round(args.lines / wall),
        "mb_per_s": round(size / wall / 1e6, 1), "peak_rss_mib": round(peak_kib / 1024, 1),
        "pass_seconds": meta["source"]["seconds"], "num_embeddings": meta["num_embeddings"],
        "splits": meta["splits"],
    }
    print("\n".join(_write_results(res, args.lines)))
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
