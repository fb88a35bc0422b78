#!/usr/bin/env python
"""Issue 34's one-GPU figure: hetgmp on multi-hot data against a plain ``nn.EmbeddingBag`` WDL.

    python bench/gpu/multi_hot_bag.py --out bench/results/gpu/multi_hot_bag   # on one GPU
    python bench/gpu/multi_hot_bag.py --smoke --out /tmp/mhb                  # CPU, tiny

1. Generates the figure's data set once (``hetgmp generate criteo-like --multi-hot 2:20``: the
   26 single-hot criteo-like fields plus 2 multi-hot fields of mean length 20), reused when
   ``--data`` already holds it.
2. Per batch size (8192 and 65536): ``examples/hetuctr.py`` (WDL, dim 128, one rank) through
   ``bench/gpu/switches.py hetgmp.train.multi_hot.GPU_ONE_RANK=1`` (the one-GPU multi-hot path;
   on by default since this figure was first measured, 2026-11-26), its ``--output`` JSON read for samples/s; then the plain
   contender (``plain_bags.py``: ``F.embedding`` + ``nn.EmbeddingBag`` pooling, sparse SGD,
   fused Adam head, data resident on the device; each variant of ``--plain-variants``, the
   fastest taken), each in a process of its own (its GPU memory freed for the next).
3. Writes ``multi_hot_bag.json`` (every record) and ``multi_hot_bag.md`` (a table: samples/s
   of both, the ratio, the figure's 2x target met or not) under ``--out``.

Both sides run the same steps (``--iters``, the first ``--warmup`` untimed) with the same
table optimizer (SGD) and pooling; hetgmp's speed is its own clock (global samples/s after its
warm-up), the plain one CUDA events around its timed loop. ``--smoke`` runs everything on CPU
at tiny sizes (``tests/test_bench_gpu.py`` runs it): the plumbing, not a figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench.gpu` and `hetgmp` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROOT = Path(__file__).resolve().parents[2]
SWITCH = "hetgmp.train.multi_hot.GPU_ONE_RANK=1"
TARGET = 2.0  # the figure: hetgmp >= 2x the plain model's samples/s
# the figure's set, and the smoke test's
# (scale 1: the 33.8M-row table of the single-hot figures, train_gpu.sh's CARD_SCALE; the
# samples need not cover the steps: both sides cycle through the training split)
FULL = dict(samples=2_000_000, scale=1.0, multi_hot="2:20", batches=(8192, 65536), iters=100,
            warmup=20, dim=128, device="cuda", variants="bf16,bf16+graph")  # fmt: skip
SMOKE = dict(samples=3000, scale=0.001, multi_hot="2:6", batches=(256, 512), iters=4, warmup=1,
             dim=16, device="cpu", variants="fp32")  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="results directory")
    p.add_argument("--data", type=Path, default=None, help="data set directory (default: OUT/data)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: the plumbing only")
    p.add_argument("--samples", type=int, help="generated samples")
    p.add_argument("--scale", type=float, help="generator --scale (the table's size)")
    p.add_argument("--batches", help="comma list of batch sizes (default 8192,65536)")
    p.add_argument("--iters", type=int, help="steps per run, --warmup of them untimed")
    p.add_argument("--warmup", type=int)
    p.add_argument("--pooling", default="mean", help="--pooling of both sides (sum|mean|a,b)")
    p.add_argument("--lr", type=float, default=10.0, help="the table's SGD rate, both sides")
    p.add_argument("--plain-variants", help="plain_ctr.py variants; the fastest counts")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    p.add_argument("--plain-run", type=Path, help=argparse.SUPPRESS)  # (internal: one plain run)
    args = p.parse_args(argv)
    base = SMOKE if args.smoke else FULL
    for key in ("samples", "scale", "iters", "warmup"):
        if getattr(args, key) is None:
            setattr(args, key, base[key])
    args.batches = (tuple(int(b) for b in args.batches.split(",")) if args.batches
                    else base["batches"])  # fmt: skip
    args.plain_variants = args.plain_variants or base["variants"]
    args.multi_hot, args.dim, args.device = base["multi_hot"], base["dim"], base["device"]
    args.data = args.data or args.out / "data"
    return args


def _run(cmd: list[str], log: Path, timeout: int) -> None:
    """Run ``cmd`` from the repository root, its output in ``log``; a failure names the log."""
    with log.open("w") as f:
        got = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    if got.returncode:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"{' '.join(cmd[:4])}... failed ({got.returncode}), see {log}:\n{tail}")


def generate(args: argparse.Namespace) -> None:
    """The data set, unless ``--data`` already holds one."""
    if (args.data / "meta.json").exists():
        return
    args.out.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "hetgmp", "generate", "criteo-like", "--out", str(args.data),
          "--num-samples", str(args.samples), "--scale", str(args.scale), "--multi-hot",
          args.multi_hot, "--workers", "16", "--no-progress", "--overwrite"],
         args.out / "generate.log", args.timeout)  # fmt: skip


def run_hetgmp(args: argparse.Namespace, batch: int) -> dict[str, Any]:
    """``examples/hetuctr.py`` with the one-GPU multi-hot switch on; its results JSON."""
    res = args.out / f"hetgmp_b{batch}.json"
    cli = ["examples/hetuctr.py", "--dataset", str(args.data), "--device", args.device,
           "--model", "wdl", "--batch-size", str(batch), "--embed-dim", str(args.dim),
           "--iter", str(args.iters), "--epochs", "1000", "--warmup-steps", str(args.warmup),
           "--optimizer", "sgd", "--lr", str(args.lr), "--pooling", args.pooling,
           "--log-every", "50", "--no-progress", "--output", str(res)]  # fmt: skip
    cmd = [sys.executable, "bench/gpu/switches.py", SWITCH, "--", *cli]
    _run(cmd, args.out / f"hetgmp_b{batch}.log", args.timeout)
    got = json.loads(res.read_text())
    return {"contender": "hetgmp", "batch": batch, "samples_per_s": got.get("speed"),
            "val_auc": got.get("val_auc"), "step_graph": got.get("step_graph"),
            "amp": got.get("amp"), "command": " ".join(cmd)}  # fmt: skip


def run_plain(args: argparse.Namespace, batch: int) -> list[dict[str, Any]]:
    """The plain contender's variants, in a process of their own (this script's
    ``--plain-run``); one record each."""
    rec = args.out / f"plain_b{batch}.jsonl"
    rec.unlink(missing_ok=True)
    cmd = [sys.executable, "bench/gpu/multi_hot_bag.py", "--out", str(args.out), "--data",
           str(args.data), "--batches", str(batch), "--iters", str(args.iters), "--warmup",
           str(args.warmup), "--pooling", args.pooling, "--lr", str(args.lr),
           "--plain-variants", args.plain_variants, "--plain-run", str(rec)]  # fmt: skip
    if args.smoke:
        cmd.append("--smoke")
    _run(cmd, args.out / f"plain_b{batch}.log", args.timeout)
    return [json.loads(line) for line in rec.read_text().splitlines()]


def plain_records(args: argparse.Namespace) -> None:
    """(``--plain-run FILE``) Train every plain variant once at ``--batches``' one size."""
    import torch

    from bench.gpu.plain_bags import BagTrainer, load_bag_splits, trainer_args
    from bench.gpu.plain_ctr import Variant
    from bench.gpu.plain_trainer import evaluate

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    else:  # (the smoke run: on a shared CPU box more threads only contend)
        torch.set_num_threads(1)
    train, test, meta, widths = load_bag_splits(args.data, device)
    (batch,) = args.batches
    targs = trainer_args(args.data, batch, args.dim, args.pooling, args.lr, widths)
    for spec in args.plain_variants.split(","):
        v = Variant.parse(spec)
        tr = BagTrainer(targs, v, train, meta, device)
        warmup = min(args.iters, max(args.warmup, 3 if tr.use_graph else 0))
        t = tr.run(args.iters, warmup)
        steps, secs = int(t["timed_steps"]), t["timed_s"]
        rec = {"contender": "plain-embeddingbag", "variant": v.name, "batch": batch,
               "samples_per_s": batch * steps / secs if steps and secs > 0 else None,
               **evaluate(tr.model, test, 65536, v.amp), "cuda_graph": tr.graph is not None,
               "cuda_graph_error": tr.graph_error or None, "widths": widths}  # fmt: skip
        with args.plain_run.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        del tr


def table(records: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The markdown report: per batch size both speeds, the ratio and the target."""
    lines = [
        "# Multi-hot one-GPU figure (issue 34)",
        "",
        f"{args.samples} generated samples (--multi-hot {args.multi_hot}, --scale "
        f"{args.scale}), WDL dim {args.dim}, --pooling {args.pooling}, SGD rows, "
        f"{args.iters} steps ({args.warmup} untimed), device {args.device}"
        + (" (SMOKE: tiny CPU run, not a figure)" if args.smoke else ""),
        "",
        "| batch | hetgmp samples/s | plain EmbeddingBag samples/s (best variant) | ratio "
        f"| >= {TARGET:g}x | hetgmp step graph |",
        "|---|---|---|---|---|---|",
    ]
    for batch in args.batches:
        het = next(r for r in records if r["contender"] == "hetgmp" and r["batch"] == batch)
        plain = [r for r in records if r["contender"] != "hetgmp" and r["batch"] == batch]
        best = max(plain, key=lambda r: r["samples_per_s"] or 0.0)
        ratio = (het["samples_per_s"] or 0.0) / (best["samples_per_s"] or float("inf"))
        lines.append(
            f"| {batch} | {het['samples_per_s']:,.0f} | {best['samples_per_s']:,.0f} "
            f"({best['variant']}) | {ratio:.2f} | {'yes' if ratio >= TARGET else 'NO'} "
            f"| {het['step_graph']} |"
        )
        for r in (het, best):
            r["ratio"] = ratio if r is het else None
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plain_run is not None:
        plain_records(args)
        return 0
    generate(args)
    records: list[dict[str, Any]] = []
    for batch in args.batches:
        records.append(run_hetgmp(args, batch))
        records += run_plain(args, batch)
    md = table(records, args)
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    (args.out / "multi_hot_bag.json").write_text(
        json.dumps({"date": stamp, "smoke": args.smoke, "records": records}, indent=1) + "\n"
    )
    (args.out / "multi_hot_bag.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
