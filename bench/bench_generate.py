"""Time and peak memory of ``hetgmp generate criteo-like`` at scale 1.

Cases: ``4m`` (4,000,000 samples) and ``kaggle`` (45,840,617 samples, the full Kaggle shape).
Each case runs in a fresh process (``/usr/bin/time``-style peak RSS via ``resource``), and the
results are appended to ``bench/results/generate.json`` and rewritten as
``bench/results/generate.md`` with machine, command and date.

Usage: ``python bench/bench_generate.py [--cases 4m kaggle] [--out-dir /tmp/hetgmp-bench]``.
The generated data sets are deleted afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CASES = {"4m": 4_000_000, "kaggle": 45_840_617}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.node()}: {os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB RAM"


def run_case(name: str, out_dir: Path, keep: bool) -> dict:
    out = out_dir / f"criteo-like-{name}"
    cmd = [sys.executable, "-m", "hetgmp.cli", "generate", "criteo-like", "--out", str(out),
           "--num-samples", str(CASES[name]), "--scale", "1", "--overwrite", "--no-progress"]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    meta = json.loads((out / "meta.json").read_text())
    size = sum(p.stat().st_size for p in out.iterdir())
    if not keep:
        shutil.rmtree(out)
    return {
        "case": name,
        "num_samples": CASES[name],
        "rows": meta["num_embeddings"],
        "wall_s": round(wall, 1),
        "samples_per_s": round(CASES[name] / wall),
        "peak_rss_gib": round(peak_kib / 2**20, 2),
        "output_gib": round(size / 2**30, 2),
        "best_auc": meta["best_auc"],
        "positive_rate_train": meta["stats"]["positive_rate_train"],
        "command": " ".join(["hetgmp", *cmd[3:]]),
        "machine": machine(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def write_markdown(records: list[dict]) -> None:
    lines = [
        "# Generating criteo-like data (scale 1)",
        "",
        "Written by `bench/bench_generate.py`; peak RSS is the generating process's maximum.",
        "",
        "| case | samples | table rows | wall s | samples/s | peak RSS GiB | output GiB | best AUC | date | machine | command |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['case']} | {r['num_samples']:,} | {r['rows']:,} | {r['wall_s']} | "
            f"{r['samples_per_s']:,} | {r['peak_rss_gib']} | {r['output_gib']} | "
            f"{r['best_auc']:.4f} | {r['date']} | {r['machine']} | `{r['command']}` |"
        )
    (RESULTS / "generate.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=["4m"])
    p.add_argument("--out-dir", type=Path, default=Path("/tmp/hetgmp-bench"))
    p.add_argument("--keep", action="store_true", help="keep the generated data sets")
    a = p.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "generate.json"
    records = json.loads(path.read_text()) if path.exists() else []
    for name in a.cases:
        # One case per child process so ru_maxrss (a maximum over children) is that case's.
        if len(a.cases) > 1:
            sub = [sys.executable, __file__, "--cases", name, "--out-dir", str(a.out_dir)]
            subprocess.run(sub + (["--keep"] if a.keep else []), check=True)
            records = json.loads(path.read_text())
            continue
        rec = run_case(name, a.out_dir, a.keep)
        print(json.dumps(rec))
        records.append(rec)
        path.write_text(json.dumps(records, indent=2) + "\n")
    write_markdown(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
