"""GPU benchmark of issue 7: ``prepare`` the data + plan, ``run`` on N ranks, ``report``.

    python bench/gpu/cli.py prepare --dir /tmp/w --samples 2000000 --world 2
    torchrun --nproc_per_node 2 bench/gpu/cli.py run --workload /tmp/w --out bench/results/gpu
    python bench/gpu/cli.py report --out bench/results/gpu --workload /tmp/w

``bench/gpu/run.sh`` chains all three on a GPU machine. ``run`` also works under ``mpirun`` or as
one plain process (``--device cpu`` for a CPU smoke run).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if sys.path and Path(sys.path[0]).resolve() == HERE:
    sys.path.pop(0)  # run as a script: import bench.gpu.*, not sibling modules by bare name
sys.path.insert(0, str(ROOT))

from bench.gpu.contenders import CONTENDERS  # noqa: E402
from bench.gpu.data import WorkloadSpec, prepare  # noqa: E402

ONE_RANK = ["torch", "hetgmp"]
MULTI_RANK = [
    "rowwise", "tablewise", "hetgmp-hash", "hetgmp-b100", "hetgmp-b100-all", "hetgmp-b0-pad",
    "hetgmp-b10-pad", "hetgmp-b100-pad",
]  # fmt: skip


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _strs(s: str) -> list[str]:
    return [x for x in s.split(",") if x]


def cmd_prepare(a: argparse.Namespace) -> int:
    spec = WorkloadSpec(
        num_samples=a.samples, card_scale=a.card_scale, locality=a.locality,
        samples_per_user=a.samples_per_user, seed=a.seed, world_size=a.world, method=a.method,
        rounds=a.rounds, batch_size=a.partition_batch, max_mirror_rate=a.max_mirror_rate,
    )  # fmt: skip
    wl = prepare(a.dir, spec, threads=a.threads)
    info = wl.info
    print(
        f"[prepare] {spec.num_samples:,} samples x {info['num_fields']} fields, "
        f"{info['num_rows']:,} rows ({info['id_law']}) generated in {info['generate_s']:.1f} s",
        flush=True,
    )
    if "partition" in info:
        p = info["partition"]
        print(
            f"[prepare] plan {p['method']} for {spec.world_size} parts in {p['wall_s']:.1f} s; "
            f"remote fetches/step {p.get('fetches_per_step') or 0:,.0f}; "
            f"samples per worker {p['samples_per_worker']}",
            flush=True,
        )
    return 0


def cmd_run(a: argparse.Namespace) -> int:
    import torch

    from bench.gpu.harness import RunConfig, run_rank, write_json
    from hetgmp.comm.launch import init_distributed, shutdown

    if a.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("run --device cuda: CUDA is not available on this machine")
        want = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
        if torch.cuda.device_count() < want:
            raise SystemExit(
                f"run --device cuda: {want} ranks on this host but only "
                f"{torch.cuda.device_count()} GPU(s); launch at most that many ranks"
            )
    env = init_distributed(device=a.device, timeout_s=a.timeout)
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)  # events and autocast use the current device
    if a.device == "cuda" and env.backend not in ("nccl", "none"):
        raise SystemExit(f"run --device cuda: expected the NCCL backend, got {env.backend}")
    try:
        out = Path(a.out)
        w = env.world_size
        contenders = _strs(a.contenders) if a.contenders else (ONE_RANK if w == 1 else MULTI_RANK)
        jsonl = out / f"raw_w{w}.jsonl"
        if env.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            jsonl.write_text("")
        cfg = RunConfig(
            workload=a.workload, contenders=contenders, modes=_strs(a.modes),
            batches=_ints(a.batches),
            train_batches=_ints(a.train_batches) if a.train_batches else None,
            models=_strs(a.models), precisions=_strs(a.precisions), dim=a.dim, warmup=a.warmup,
            steps=a.steps, profile_steps=a.profile_steps, lr=a.lr, seed=a.seed,
            store_rate=a.store_rate, jsonl=str(jsonl),
            command=a.command or shlex.join([Path(sys.executable).name, *sys.argv]),
        )  # fmt: skip
        payload = run_rank(env, cfg)
        if env.rank == 0:
            write_json(out / f"results_w{w}.json", payload)
            print(f"[run] wrote {out / f'results_w{w}.json'}", flush=True)
    finally:
        shutdown(env)
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    from bench.gpu.report import write_report

    js, md, table = write_report(Path(a.out), Path(a.workload) if a.workload else None)
    print(f"[report] wrote {js} and {md}\n")
    print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("prepare", help="generate the data set (and the plan for --world > 1)")
    p.add_argument("--dir", required=True, help="workload directory (reused when it matches)")
    p.add_argument("--samples", type=int, default=2_000_000)
    p.add_argument("--card-scale", type=float, default=1.0, help="1.0 = Criteo Kaggle, 33.8M rows")
    p.add_argument("--locality", type=float, default=0.8, help="0 = i.i.d. u^4 ids")
    p.add_argument("--samples-per-user", type=float, default=106.0)
    p.add_argument("--world", type=int, default=2, help="parts of the plan (1: no plan)")
    p.add_argument("--method", default="metis+refine", help="partition method")
    p.add_argument("--rounds", type=int, default=2, help="refinement rounds")
    p.add_argument("--partition-batch", type=int, default=8192)
    p.add_argument("--max-mirror-rate", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=0, help="0 = all cores")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_prepare)

    r = sub.add_parser("run", help="measure (launch with torchrun / mpirun / one process)")
    r.add_argument("--workload", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--device", default="cuda", choices=("cuda", "cpu", "auto"))
    r.add_argument("--contenders", default="",
                   help=f"comma list from {', '.join(CONTENDERS)}, hetgmp (1 rank); "
                   f"default {','.join(ONE_RANK)} on 1 rank, {','.join(MULTI_RANK)} on more")  # fmt: skip
    r.add_argument("--modes", default="embedding,train")
    r.add_argument("--batches", default="8192,65536", help="batch sizes per GPU")
    r.add_argument(
        "--train-batches", default="", help="batch sizes for train mode (default --batches)"
    )
    r.add_argument("--models", default="wdl,dcn", help="models of the train mode, in order")
    r.add_argument("--precisions", default="fp32,bf16")
    r.add_argument("--dim", type=int, default=128)
    r.add_argument("--warmup", type=int, default=5)
    r.add_argument("--steps", type=int, default=20)
    r.add_argument("--profile-steps", type=int, default=5)
    r.add_argument("--lr", type=float, default=0.01)
    r.add_argument("--store-rate", type=float, default=0.01)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--timeout", type=float, default=300.0, help="collective timeout, seconds")
    r.add_argument("--command", default="", help="the command line to record (run.sh passes it)")
    r.set_defaults(fn=cmd_run)

    q = sub.add_parser("report", help="merge results_w*.json into results.json + results.md")
    q.add_argument("--out", required=True)
    q.add_argument("--workload", default="")
    q.set_defaults(fn=cmd_report)

    a = ap.parse_args(argv)
    return int(a.fn(a))


if __name__ == "__main__":
    sys.exit(main())
