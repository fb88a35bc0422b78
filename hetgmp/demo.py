"""The end-to-end demo behind ``make demo``: generate, partition, train on CPU ranks.

1. the embedded default data set (a generated criteo-like set, cached under ~/.cache/hetgmp);
2. ``hetgmp partition -n NP`` (metis+refine) into ``OUT/part.npz``, with its quality report;
3. ``mpirun -np NP python examples/hetuctr.py --partition OUT/part.npz --bound B
   --store_rate S`` on CPU ranks (gloo), logs and results under ``OUT``;
4. a summary: AUC next to the data set's best possible AUC, traffic, throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hetgmp.fmt import key_values

ROOT = Path(__file__).resolve().parents[1]


def _mpi_env() -> dict[str, str]:
    env = dict(os.environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Open MPI refuses root unless told; containers and CI run as root.
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hetgmp.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="working directory")
    parser.add_argument("--np", type=int, default=4, help="number of CPU ranks (default: 4)")
    parser.add_argument("--bound", type=int, default=100, help="staleness bound (default: 100)")
    parser.add_argument(
        "--store-rate", type=float, default=0.01,
        help="share of rows each rank mirrors (default: 0.01)",
    )  # fmt: skip
    parser.add_argument("--epochs", type=int, default=1, help="training epochs (default: 1)")
    parser.add_argument("--method", default="metis+refine", help="partition method")
    args = parser.parse_args(argv)
    if args.np < 1:
        parser.error("--np must be >= 1")
    return args


def _partition(args: argparse.Namespace, ds: Any, plan_path: Path) -> None:
    from hetgmp.partition.cli import PartitionConfig, run_partition

    print(f"[demo 2/3] partition into {args.np} parts ({args.method}) -> {plan_path}", flush=True)
    plan = run_partition(
        PartitionConfig(nparts=args.np, out=plan_path, data=ds.root, method=args.method)
    )
    quality = plan.meta.get("quality", {})
    if quality:
        flat = {k: v for k, v in quality.items() if not isinstance(v, (list, dict))}
        print(json.dumps(flat, indent=1))


def _train_command(args: argparse.Namespace, ds: Any, plan_path: Path, out: Path) -> list[str]:
    from hetgmp.experiments.launch import find_mpirun

    return [
        find_mpirun(), "-np", str(args.np), "--oversubscribe", sys.executable,
        str(ROOT / "examples" / "hetuctr.py"), "--dataset", str(ds.root), "--partition",
        str(plan_path), "--bound", str(args.bound), "--store_rate", str(args.store_rate),
        "--epochs", str(args.epochs), "--output", str(out / "result.json"), "--log-json",
        str(out / "train.jsonl"), "--no-progress",
    ]  # fmt: skip


def _summary(args: argparse.Namespace, ds: Any, result_path: Path) -> None:
    res = json.loads(result_path.read_text())
    emb = res.get("embedding_train", {})
    print("\n=== demo summary ===")
    print(
        f"data set        {ds.root} ({key_values(ds.meta.splits)}, {ds.meta.num_embeddings} rows)"
    )
    print(f"best possible   AUC {ds.meta.best_auc:.4f}" if ds.meta.best_auc else "")
    print(
        f"trained         AUC {res['val_auc']:.4f}  logloss {res['val_loss']:.4f}"
        f"  ({res['samples_seen']:,} samples, {args.np} ranks, bound {args.bound})"
    )
    print(f"speed           {res['speed']:,.0f} global samples/s (CPU ranks)")
    print(
        f"embedding       {emb.get('bytes_per_sample', 0):.1f} bytes/sample between ranks, "
        f"mirror hit rate {emb.get('mirror_hit', 0):.3f}"
    )
    print(f"results         {result_path}")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from hetgmp.data.defaults import ensure_default_dataset

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    ds = ensure_default_dataset()
    print(f"[demo 1/3] data set: {ds.root}", flush=True)
    plan_path = out / "part.npz"
    _partition(args, ds, plan_path)
    cmd = _train_command(args, ds, plan_path, out)
    print(f"[demo 3/3] {' '.join(cmd)}", flush=True)
    rc = subprocess.call(cmd, env=_mpi_env())
    if rc != 0:
        print(f"demo: training failed (exit {rc})", file=sys.stderr)
        return rc
    _summary(args, ds, out / "result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
