"""Scale run: the Criteo Kaggle shape (45.8M samples x 26 fields, 33.8M rows) into 8 parts.

    .venv/bin/python bench/bench_partition_scale.py                       # full shape
    .venv/bin/python bench/bench_partition_scale.py --samples 2000000 --card-scale 0.1   # small

Ids of field f are ``floor(u^4 * cardinality_f)`` with u uniform (the shape HET-GMP's own scale
run used), generated in parallel chunks straight into a ``.npy`` file under ``--work-dir``. The
partitioner then runs in a fresh child process that memory-maps that file, so the peak RSS it
reports covers the input pages it touches plus everything the partitioner allocates (HET-GMP's
332 s / 17.5 GB on the 16-core machine included its input too). Results (wall time, peak RSS,
per-stage times, quality) go to ``--out`` with machine, command and date.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KAGGLE_SAMPLES = 45_840_617
# Distinct values per categorical field of Criteo Kaggle train.txt (sum 33,762,577).
KAGGLE_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
    14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]
CHUNK = 1 << 20


def generate(path: Path, samples: int, cards: np.ndarray, seed: int, threads: int) -> float:
    """Write ids [samples, 26] int32 to ``path`` (.npy); returns seconds."""
    t0 = time.perf_counter()
    offsets = np.concatenate([[0], np.cumsum(cards)[:-1]]).astype(np.int64)
    tmp = path.with_suffix(".tmp.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int32, shape=(samples, len(cards)))

    def fill(k: int) -> None:
        lo, hi = k * CHUNK, min(samples, (k + 1) * CHUNK)
        rng = np.random.default_rng([seed, k])  # per chunk: the data do not depend on threads
        u = rng.random((hi - lo, len(cards)), dtype=np.float32)
        ids = np.minimum(np.floor(u**4 * cards), cards - 1).astype(np.int64) + offsets
        out[lo:hi] = ids

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(fill, range((samples + CHUNK - 1) // CHUNK)))
    out.flush()
    os.replace(tmp, path)
    return time.perf_counter() - t0


def child(ids_path: Path, num_rows: int, nparts: int, threads: int | None, batch: int,
          rounds: int, out_json: Path) -> int:
    """Partition the memory-mapped ids; write the measurements as JSON."""
    from hetgmp.partition.api import partition_ids, peak_rss_mb
    from hetgmp.partition.plan import save_plan

    t0 = time.perf_counter()
    ids = np.load(ids_path, mmap_mode="r")
    plan = partition_ids(ids, num_rows, nparts, method="metis+refine", batch_size=batch,
                         rounds=rounds, threads=threads, progress=sys.stderr.isatty())
    wall = time.perf_counter() - t0
    peak = peak_rss_mb()
    save_plan(plan, out_json.with_suffix(".npz"))
    q = plan.meta["quality"]
    res = {
        "wall_s": wall, "peak_rss_mb": peak, "timing": plan.meta["timing"],
        "metis": plan.meta.get("metis"), "fetches_per_step": q["fetches_per_step"],
        "baselines": {k: v["fetches_per_step"] for k, v in q.get("baselines", {}).items()},
        "cost_history": q["cost_history"], "balance": q["max_over_mean"],
    }
    out_json.write_text(json.dumps(res, indent=2))
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=KAGGLE_SAMPLES)
    ap.add_argument("--card-scale", type=float, default=1.0, help="multiply every cardinality")
    ap.add_argument("--nparts", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="default: all cores")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/hetgmp-partition-scale"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "partition_scale.md")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    return ap


def _child_command(args: argparse.Namespace, res_json: Path) -> list[str]:
    """The measured run: this script again in a fresh process (its peak RSS is the run's)."""
    cmd = [sys.executable, __file__, "--child", str(res_json), "--samples", str(args.samples),
           "--card-scale", str(args.card_scale), "--nparts", str(args.nparts),
           "--batch-size", str(args.batch_size), "--rounds", str(args.rounds),
           "--seed", str(args.seed), "--work-dir", str(args.work_dir)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return cmd


def _report(args: argparse.Namespace, res: dict, num_rows: int, gen_s: float | None) -> list[str]:
    from bench_partition_quality import machine  # same folder

    return [
        "# Partition scale run (metis+refine, Criteo Kaggle shape, ids floor(u^4 * card))",
        "",
        f"- machine: {machine()}",
        f"- command: `{' '.join([Path(sys.executable).name, *sys.argv])}`",
        f"- date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}",
        f"- shape: {args.samples} samples x 26 fields, {num_rows} rows, {args.nparts} parts, "
        f"batch {args.batch_size}, {args.rounds} rounds, threads {args.threads or os.cpu_count()}",
        f"- data generation (not included below): {gen_s:.1f} s" if gen_s else
        "- data generation: reused an existing file",
        f"- **partition wall time: {res['wall_s']:.1f} s, peak RSS {res['peak_rss_mb'] / 1024:.2f} GiB** "
        "(input pages included; plan report with random/hash baselines included)",
        "- stages (s): " + ", ".join(f"{k}={v:.1f}" for k, v in res["timing"].items()),
        f"- expected fetches/step: metis+refine {res['fetches_per_step']:.0f}; "
        + ", ".join(f"{k} {v:.0f}" for k, v in res["baselines"].items()),
        f"- cost per round: {[round(c) for c in res['cost_history']]}",
        f"- METIS: {res['metis']}",
        "- HET-GMP's own code, same shape, 16-core machine: 332 s, 17.5 GB peak",
    ]


def main() -> int:
    args = _parser().parse_args()
    cards = np.maximum(1, np.round(np.array(KAGGLE_CARDINALITIES) * args.card_scale)).astype(np.int64)
    num_rows = int(cards.sum())
    ids_path = args.work_dir / f"ids_{args.samples}_{args.card_scale}_{args.seed}.npy"
    if args.child:
        return child(ids_path, num_rows, args.nparts, args.threads, args.batch_size,
                     args.rounds, args.child)

    args.work_dir.mkdir(parents=True, exist_ok=True)
    gen_s = None
    if not ids_path.exists():
        gen_s = generate(ids_path, args.samples, cards, args.seed, args.threads or os.cpu_count() or 1)
        print(f"generated {args.samples} x 26 ids in {gen_s:.1f} s -> {ids_path}", flush=True)
    res_json = args.work_dir / "result.json"
    subprocess.run(_child_command(args, res_json), check=True)
    lines = _report(args, json.loads(res_json.read_text()), num_rows, gen_s)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
