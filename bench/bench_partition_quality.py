"""Partition quality table: expected fetched rows per step for every method, 8 parts.

    .venv/bin/python bench/bench_partition_quality.py [--criteo-like data/criteo-like-4m]
        [--shared ../shared/datasets] [--out bench/results/partition_quality.md]

Data sets: the generated criteo-like set (its training split), ``movielens-100k`` and
``criteo-sample`` (read in place from the shared folder with HET-GMP's reference encodings, see
``partition_data.py``). Settings: batch 8192 (the quality table) and, for the two real samples,
HET-GMP's reference setting (batch 1024, 5 rounds, all-ones topology) next to the figures its
own code gave on them. Writes a markdown table and a JSON file with machine, command and date.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from partition_data import criteo_sample_graph, movielens_graph  # noqa: E402

from hetgmp.partition.api import METHODS, partition_ids, peak_rss_mb  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# HET-GMP's partitioner on these encodings (8 parts, batch 1024, 5 rounds, all-ones topology)
HETGMP_REFERENCE = {"movielens-100k": (9447, 4307), "criteo-sample": (38831, 10295)}


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()} ({os.cpu_count()} cores, {cpu}, Python {platform.python_version()})"


def run_methods(
    name: str,
    ids: np.ndarray,
    rows: int,
    batch: int,
    threads: int | None,
    methods: tuple[str, ...] = METHODS,
) -> list[dict[str, Any]]:
    out = []
    for method in methods:
        t0 = time.perf_counter()
        plan = partition_ids(
            ids,
            rows,
            8,
            method=method,
            batch_size=batch,
            rounds=5,
            threads=threads,
            report_baselines=False,
            progress=False,
        )
        q = plan.meta["quality"]
        out.append(
            {
                "data": name,
                "batch": batch,
                "method": method,
                "start": q["cost_history"][0],
                "fetches": q["fetches_per_step"],
                "store_0.01": q["fetches_per_step_with_store_rate"]["0.01"],
                "balance": q["max_over_mean"],
                "seconds": time.perf_counter() - t0,
            }
        )
        print(
            f"{name} batch={batch} {method}: {out[-1]['fetches']:.1f} ({out[-1]['seconds']:.1f} s)",
            flush=True,
        )
    base = {r["method"]: r["fetches"] for r in out}
    for r in out:
        r["vs_random_pct"] = (
            100.0 * (1 - r["fetches"] / base["random"]) if "random" in base else None
        )
        r["vs_hash_pct"] = 100.0 * (1 - r["fetches"] / base["hash"]) if "hash" in base else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--criteo-like", type=Path, default=ROOT / "data" / "criteo-like-4m")
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "datasets")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "partition_quality.md")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    rows = collect_rows(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(table_lines(rows) + reference_lines(rows)) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    print(f"wrote {args.out}")
    return 0


def collect_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every method on each data set found: the real samples at batch 1024 and 8192, the
    criteo-like set at 8192 (a missing data set is skipped with a note)."""
    rows: list[dict[str, Any]] = []
    real = []
    if args.shared.is_dir():
        real = [
            ("movielens-100k", *movielens_graph(args.shared / "movielens-100k")),
            ("criteo-sample", *criteo_sample_graph(args.shared / "criteo-sample")),
        ]
    else:
        print(f"skipping real samples: {args.shared} not found", file=sys.stderr)
    for name, ids, nrows in real:
        rows += run_methods(name, ids, nrows, 1024, args.threads)
        rows += run_methods(name, ids, nrows, 8192, args.threads)
    if args.criteo_like.is_dir():
        from hetgmp.data.format import open_dataset

        ds = open_dataset(args.criteo_like)
        rows += run_methods(
            f"criteo-like ({len(ds.train)} train samples)",
            ds.train.sparse,
            ds.meta.num_embeddings,
            8192,
            args.threads,
        )
    else:
        print(f"skipping criteo-like: {args.criteo_like} not found", file=sys.stderr)
    return rows


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The header (machine, command, date, peak memory, what the cost is) and the main table."""
    header = [
        "# Partition quality: expected fetched rows per step, 8 parts",
        "",
        f"- machine: {machine()}",
        f"- command: `{' '.join([Path(sys.executable).name, *sys.argv])}`",
        f"- date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}",
        f"- peak RSS of the whole benchmark: {peak_rss_mb():.0f} MiB",
        "- cost: sum over workers of expected remote rows per step (HET-GMP's batch-aware soft "
        "count), all-ones topology, 5 refine rounds, no mirrors; `vs random/hash` = change in fetches (negative = fewer)",
        "",
        "| data | batch | method | start | fetches/step | vs random | vs hash | "
        "with 1 % mirrors | max/mean samples | max/mean rows | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines = []
    for r in rows:
        lines.append(
            f"| {r['data']} | {r['batch']} | {r['method']} | {r['start']:.0f} | {r['fetches']:.0f} "
            f"| {-r['vs_random_pct']:+.1f} % | {-r['vs_hash_pct']:+.1f} % | {r['store_0.01']:.0f} "
            f"| {r['balance']['samples']:.3f} | {r['balance']['rows']:.3f} | {r['seconds']:.1f} |"
        )
    return header + lines


def reference_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Ours next to HET-GMP's own figures in its reference setting (real samples only)."""
    ref_lines = [
        "",
        "## HET-GMP reference setting (batch 1024, 8 parts, 5 rounds)",
        "",
        "| data | HET-GMP start -> refined | ours: refine start -> refined | ours: metis+refine |",
        "|---|---|---|---|",
    ]
    for name, (h0, h1) in HETGMP_REFERENCE.items():
        ours = {r["method"]: r for r in rows if r["data"] == name and r["batch"] == 1024}
        if not ours:
            continue
        ref = ours["refine"]
        mr = ours["metis+refine"]
        ref_lines.append(
            f"| {name} | {h0} -> {h1} (-{100 * (1 - h1 / h0):.1f} %) | {ref['start']:.0f} -> "
            f"{ref['fetches']:.0f} ({100 * (ref['fetches'] / h1 - 1):+.1f} % vs HET-GMP) | "
            f"{mr['fetches']:.0f} ({100 * (mr['fetches'] / h1 - 1):+.1f} % vs HET-GMP) |"
        )
    return ref_lines


if __name__ == "__main__":
    sys.exit(main())
