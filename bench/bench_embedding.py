"""Benchmark of the embedding step alone: lookup + exchange + update with a fixed random gradient.

Launch with ``mpirun -np N`` or ``torchrun --nproc-per-node N`` (or alone). Each rank trains on its
plan's samples (``rank_sample_indices``) for every combination of placement (``hash`` plan vs a
partitioned plan), bound and store rate, and reports ms per step split into unique / exchange /
gather / update (device-synchronised phase marks) and bytes sent per sample by kind. Results
(with machine, command and date) go to ``--out`` as JSON plus a markdown table.

    mpirun -np 4 --oversubscribe .venv/bin/python bench/bench_embedding.py \
        --data runs/bench/data --plan runs/bench/plan4.npz --dim 16 --batch 1024
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from hetgmp.comm import collectives
from hetgmp.comm.launch import init_distributed, shutdown
from hetgmp.data.format import open_dataset
from hetgmp.data.loader import rank_sample_indices
from hetgmp.embedding import DistributedEmbedding
from hetgmp.embedding.profile import PHASES
from hetgmp.partition.api import partition_ids
from hetgmp.partition.baselines import hash_plan
from hetgmp.partition.plan import load_plan, save_plan

KINDS = ("ids", "versions", "values", "gradients")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="dataset directory (hetgmp format)")
    ap.add_argument(
        "--plan", type=Path, help="partitioned plan; made with metis+refine when absent"
    )
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1024, help="batch size per rank")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--bounds", type=int, nargs="+", default=[0, 10, 100])
    ap.add_argument("--store-rates", type=float, nargs="+", default=[0.0, 0.01, 0.1])
    ap.add_argument("--placements", nargs="+", default=["hash", "plan"], choices=["hash", "plan"])
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adagrad"])
    ap.add_argument("--device", default="auto")
    ap.add_argument(
        "--timing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="per-phase split (adds a device sync per phase)",
    )
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    return ap.parse_args(argv)


def get_plans(args: argparse.Namespace, env, ds) -> dict:
    n, rows = len(ds.train), ds.meta.num_embeddings
    plans = {}
    if "hash" in args.placements:
        plans["hash"] = hash_plan(n, rows, env.world_size, sparse=np.asarray(ds.train.sparse))
    if "plan" in args.placements:
        path = args.plan or args.data / f"bench_plan_{env.world_size}.npz"
        if env.is_main and not path.exists():
            save_plan(
                partition_ids(np.asarray(ds.train.sparse), rows, env.world_size, progress=False),
                path,
            )
        collectives.barrier(env)
        plans["plan"] = load_plan(path)
    return plans


def run_config(args, env, ds, plan, bound: int, rate: float) -> dict:
    """One (plan, bound, store rate): the timed steps, then per-step times, bytes and row
    shares averaged over ranks."""
    split = ds.train
    idx = rank_sample_indices(len(split), env.rank, env.world_size, plan)
    emb = DistributedEmbedding(
        ds.meta.num_embeddings,
        args.dim,
        env,
        plan,
        store_rate=rate,
        bound=bound,
        optimizer=args.optimizer,
        lr=0.01,
    )
    samples, elapsed, delta = _timed_steps(args, env, emb, split, idx)
    vec = [
        samples,
        elapsed,
        *(emb.timer.seconds[p] for p in PHASES),
        *(delta[f"bytes_sent_{k}"] for k in KINDS),
        delta["rows_requested"],
        delta["rows_owned"],
        delta["rows_mirror_fresh"],
        delta["rows_mirror_stale_ok"],
        delta["rows_remote"],
    ]
    tot = collectives.all_reduce_sum(env, np.array(vec, dtype=np.float64))
    return _result_row(tot, env.world_size, args.steps)


def _timed_steps(args, env, emb, split, idx: np.ndarray) -> tuple[int, float, dict]:
    """Warm-up then ``args.steps`` timed steps of this rank's batches (a fixed random
    gradient); returns samples, seconds and the counters' change over the timed steps."""
    fields = split.sparse.shape[1]
    g = torch.randn(args.batch, fields, args.dim, device=env.device, generator=None) * 1e-3
    nb = max(1, len(idx) // args.batch)
    total = args.warmup + args.steps
    samples = 0
    t0 = 0.0
    for s in range(total):
        if s == args.warmup:
            collectives.barrier(env)
            emb.timer.enabled = args.timing
            emb.timer.reset()
            base = emb.counters()
            t0 = time.perf_counter()
        b = s % nb
        sel = idx[b * args.batch : (b + 1) * args.batch]
        ids = torch.from_numpy(np.asarray(split.sparse[np.sort(sel)], dtype=np.int64)).to(
            env.device
        )
        out = emb(ids)
        out.backward(g[: out.shape[0]])
        if s >= args.warmup:
            samples += ids.shape[0]
    emb.flush()  # not timed: the last step's gradients
    elapsed = time.perf_counter() - t0
    c = emb.counters()
    return samples, elapsed, {k: c[k] - base[k] for k in c}


def _result_row(tot: np.ndarray, w: int, steps: int) -> dict:
    """The table row from the totals over ranks (laid out as :func:`run_config`'s ``vec``)."""
    row = {"samples": int(tot[0]), "ms_per_step": 1000 * tot[1] / w / steps}
    for i, p in enumerate(PHASES):
        row[f"ms_{p}"] = 1000 * tot[2 + i] / w / steps
    for i, k in enumerate(KINDS):
        row[f"bytes_per_sample_{k}"] = tot[6 + i] / tot[0]
    row["bytes_per_sample"] = sum(row[f"bytes_per_sample_{k}"] for k in KINDS)
    req = tot[10]
    for i, k in enumerate(("owned", "mirror_fresh", "mirror_stale_ok", "remote")):
        row[f"share_{k}"] = tot[11 + i] / req
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = init_distributed(device=args.device)
    ds = open_dataset(args.data)
    plans = get_plans(args, env, ds)
    rows = []
    for name, plan in plans.items():
        for bound in args.bounds:
            for rate in args.store_rates:
                r = run_config(args, env, ds, plan, bound, rate)
                r.update(placement=name, bound=bound, store_rate=rate)
                rows.append(r)
                if env.is_main:
                    print(
                        f"bench_embedding placement={name} bound={bound} store_rate={rate} "
                        f"ms_per_step={r['ms_per_step']:.2f} bytes_per_sample={r['bytes_per_sample']:.1f} "
                        f"remote_share={r['share_remote']:.3f}",
                        flush=True,
                    )
    if env.is_main:
        now = datetime.datetime.now(datetime.timezone.utc)
        info = {
            "machine": f"{platform.node()} {platform.processor() or platform.machine()} "
            f"cpus={__import__('os').cpu_count()} device={env.device} "
            f"{torch.cuda.get_device_name(env.device) if env.device.type == 'cuda' else ''}".strip(),
            "command": " ".join([sys.executable, *sys.argv]),
            "launcher": env.launcher,
            "world_size": env.world_size,
            "backend": env.backend,
            "date": now.isoformat(timespec="seconds"),
            "torch": torch.__version__,
            "data": str(args.data),
            "num_rows": ds.meta.num_embeddings,
            "dim": args.dim,
            "batch_per_rank": args.batch,
            "steps": args.steps,
            "optimizer": args.optimizer,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"embedding_{env.device.type}{env.world_size}_{now:%Y%m%dT%H%M%S}"
        (args.out / f"{stem}.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))
        (args.out / f"{stem}.md").write_text(markdown(info, rows))
        print(markdown(info, rows))
    shutdown(env)
    return 0


def markdown(info: dict, rows: list[dict]) -> str:
    head = "\n".join(f"- {k}: {v}" for k, v in info.items())
    cols = (
        "placement",
        "bound",
        "store_rate",
        "ms_per_step",
        "ms_unique",
        "ms_exchange",
        "ms_gather",
        "ms_update",
        "bytes_per_sample",
        "bytes_per_sample_values",
        "bytes_per_sample_gradients",
        "share_owned",
        "share_mirror_fresh",
        "share_mirror_stale_ok",
        "share_remote",
    )
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append(
            "| "
            + " | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols)
            + " |"
        )
    return f"# embedding step benchmark\n\n{head}\n\n" + "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
