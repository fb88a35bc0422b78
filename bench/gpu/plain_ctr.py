#!/usr/bin/env python
"""Plain-PyTorch WDL / DCN training: the contender a competent PyTorch user writes, made as fast
as torch alone can make it, on ONE GPU (or the CPU, for tests).

    python bench/gpu/plain_ctr.py --dataset DIR --model wdl --batch 8192 --iters 150 \\
        --variants fp32,bf16+graph,bf16+compile+graph --output runs.jsonl

What it does (the choices a speed-minded user makes):
* one fused ``nn.Embedding(num_rows, dim, sparse=True)`` for all fields (ids are global), its
  sparse gradient applied by ``torch.optim.SGD`` (or ``Adagrad`` / ``SparseAdam``:
  ``--sparse-opt``); the dense head (same WDL / DCN as hetgmp: ``plain_models.py``) with fused
  Adam (``fused=True`` on CUDA);
* TF32 matmuls; per variant optionally bf16 autocast (``bf16``), ``torch.compile`` of the head
  (``compile``) and the whole step captured as one CUDA graph (``graph``: SGD only, since the
  others coalesce the sparse gradient, which syncs with the host);
* the whole training split resident on the device, a device-side permutation, each batch
  gathered by index on the device from a device step counter; the loss is accumulated on the
  device: no host sync inside the timed loop (one at its end);
* ``--iters`` steps in total (the first ``--warmup`` untimed), the same step count as the CLI's
  ``--iter``, so AUCs compare after the same steps; then exact AUC on the whole test split.

Each variant trains from a fresh model (same seed) in the same process, which shares the data
load and CUDA start-up; each appends ONE JSON record (a line) to ``--output``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make `bench.gpu` and `hetgmp` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.plain_trainer import (  # noqa: E402,F401 (re-exported: the step lives there)
    Clock,
    PlainTrainer,
    Split,
    evaluate,
    load_split,
    make_optimizers,
)
from hetgmp.data.format import open_dataset  # noqa: E402

CONTENDER = "plain-pytorch"


SPARSE_OPTS = ("sgd", "adagrad", "adam")
# Default table learning rates. The loss is the batch MEAN, so a row's SGD gradient is ~1/B of a
# per-sample one: SGD needs a large rate (10 was the best of 1/10/100/1000 on generated
# criteo-like data, batch 1024 and 8192); Adagrad 0.05 is hetgmp's default.
SPARSE_LR = {"sgd": 10.0, "adagrad": 0.05, "adam": 1e-3}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One configuration: precision, compiled head, whole-step CUDA graph, table optimizer."""

    amp: bool = False
    compile: bool = False
    graph: bool = False
    opt: str = "sgd"

    @property
    def name(self) -> str:
        toks = ["bf16" if self.amp else "fp32"]
        toks += (["compile"] if self.compile else []) + (["graph"] if self.graph else [])
        return "+".join(toks + ([self.opt] if self.opt != "sgd" else []))

    @staticmethod
    def parse(spec: str, default_opt: str = "sgd") -> Variant:
        """``fp32``, ``bf16+compile+graph``, ``bf16+adagrad``... (tokens joined by '+')."""
        toks = [t for t in spec.strip().lower().split("+") if t]
        bad = set(toks) - {"fp32", "bf16", "amp", "compile", "graph", *SPARSE_OPTS}
        if bad or not toks:
            raise ValueError(
                f"variant {spec!r}: tokens are fp32|bf16, compile, graph, sgd|adagrad|adam"
            )
        opts = [t for t in toks if t in SPARSE_OPTS]
        return Variant("bf16" in toks or "amp" in toks, "compile" in toks, "graph" in toks,
                       opts[-1] if opts else default_opt)  # fmt: skip

    def lr(self, given: float | None) -> float:
        """``--lr`` if given, else this optimizer's default (:data:`SPARSE_LR`)."""
        return SPARSE_LR[self.opt] if given is None else given


def machine() -> str:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, {gpu}"


def run_variant(args: argparse.Namespace, v: Variant, data: tuple[Split, Split, Any],
                device: torch.device) -> dict[str, Any]:  # fmt: skip
    """Train one variant from scratch and return its record."""
    train, test, meta = data
    t0 = time.perf_counter()
    if device.type == "cuda":  # the peak then includes the data, the table and its optimizer
        torch.cuda.reset_peak_memory_stats(device)
    tr = PlainTrainer(args, v, train, meta, device)
    # graph capture needs a few eager steps first (lazy optimizer state, compile, allocator)
    warmup = min(args.iters, max(args.warmup, 3 if tr.use_graph else 0))
    setup_s = time.perf_counter() - t0
    timing = tr.run(args.iters, warmup)
    metrics = evaluate(tr.model, test, args.eval_batch, v.amp)
    secs, steps = timing["timed_s"], int(timing["timed_steps"])
    rec: dict[str, Any] = {
        "contender": CONTENDER, "variant": v.name, "model": args.model, "gpus": 1,
        "batch": args.batch, "global_batch": args.batch, "iters": args.iters, "warmup": warmup,
        "samples_per_s": args.batch * steps / secs if steps and secs > 0 else None,
        "ms_per_step": 1000.0 * secs / steps if steps else None,
        **metrics, "train_loss": timing["train_loss"],
        "epochs": args.iters * args.batch / len(train),
        "embed_dim": args.embed_dim, "lr": v.lr(args.lr), "dense_lr": args.dense_lr,
        "sparse_opt": v.opt, "dense_opt": args.dense_opt, "amp": v.amp,
        "compile": v.compile, "cuda_graph": tr.graph is not None,
        "cuda_graph_error": tr.graph_error or None, "tf32": device.type == "cuda",
        "dense_params": sum(p.numel() for p in tr.model.dense_parameters()),
        "num_rows": meta.num_embeddings, "num_fields": meta.num_fields,
        "num_dense": meta.num_dense, "train_samples": len(train), "test_samples": len(test),
        "setup_s": setup_s, "warmup_s": timing["warmup_s"], "timed_s": secs,
        "wall_s": time.perf_counter() - t0, "device": str(device), "machine": machine(),
        "torch": torch.__version__, "dataset": str(args.dataset),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": args.command or " ".join([Path(sys.executable).name, *sys.argv]),
    }  # fmt: skip
    if device.type == "cuda":
        rec["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    del tr
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the next variant allocates its own table
    return rec


def summary(rec: dict[str, Any]) -> str:
    """The one line the shell script shows per variant (the record itself goes to --output)."""
    head = f"PLAIN {rec['model']} b{rec['batch']} {rec['variant']}: "
    sps, auc = rec.get("samples_per_s"), rec.get("val_auc")
    if not sps or auc is None:
        return head + str(rec.get("status", "no step timed"))
    graph = "" if not rec.get("cuda_graph_error") else " (CUDA graph failed: eager)"
    return (
        head
        + f"{sps / 1e6:.3f}M samples/s, {rec['ms_per_step']:.3f} ms/step, val_auc {auc:.4f}{graph}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", type=Path, required=True, help="dataset directory (meta.json...)")
    p.add_argument("--model", choices=["wdl", "dcn"], default="wdl")
    p.add_argument("--batch", type=int, default=8192, help="samples per step")
    p.add_argument("--iters", type=int, default=150, help="steps in all (as the CLI's --iter)")
    p.add_argument("--warmup", type=int, default=10, help="first steps not timed (as the CLI's)")
    p.add_argument("--embed-dim", type=int, default=128)
    p.add_argument("--lr", type=float, default=None,
                   help="sparse learning rate (default per optimizer: sgd 10, adagrad 0.05, "
                        "adam 1e-3)")  # fmt: skip
    p.add_argument("--dense-lr", type=float, default=1e-3, help="dense learning rate")
    p.add_argument(
        "--sparse-opt",
        choices=SPARSE_OPTS,
        default="sgd",
        help="table optimizer: SGD, Adagrad or SparseAdam (only sgd replays as a graph)",
    )
    p.add_argument("--dense-opt", choices=["adam", "sgd"], default="adam")
    p.add_argument("--init-scale", type=float, default=0.01, help="rows start in U(-s, s)")
    p.add_argument("--amp", action="store_true", help="bf16 autocast (single-variant form)")
    p.add_argument("--compile", action="store_true", help="torch.compile the dense head")
    p.add_argument("--cuda-graphs", action="store_true", help="replay the step as a CUDA graph")
    p.add_argument(
        "--variants",
        default="",
        help="comma list, e.g. fp32,bf16+graph,bf16+compile+graph (overrides the 3 flags)",
    )
    p.add_argument("--eval-batch", type=int, default=65536)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--output", type=Path, default=None, help="append one JSON line per variant")
    p.add_argument("--command", default="", help="the command to record (default: argv)")
    args = p.parse_args(argv)
    if args.batch < 1 or args.iters < 1 or args.warmup < 0:
        p.error("--batch and --iters must be >= 1, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32: what a speed-minded user turns on
        torch.backends.cudnn.allow_tf32 = True
    specs = args.variants.split(",") if args.variants else []
    variants = [Variant.parse(s, args.sparse_opt) for s in specs] or [
        Variant(args.amp, args.compile, args.cuda_graphs, args.sparse_opt)
    ]
    meta = open_dataset(args.dataset).meta
    data = (load_split(args.dataset, "train", device), load_split(args.dataset, "test", device),
            meta)  # fmt: skip
    status = 0
    for v in variants:
        try:
            rec = run_variant(args, v, data, device)
        except Exception as err:  # noqa: BLE001 - one failing variant must not stop the others
            status = 1
            msg = f"{type(err).__name__}: {err}"[:300]
            print(f"[plain_ctr] {args.model} b{args.batch} {v.name} FAILED: {msg}", file=sys.stderr)
            rec = {"contender": CONTENDER, "variant": v.name, "model": args.model, "gpus": 1,
                   "batch": args.batch, "iters": args.iters, "samples_per_s": None,
                   "val_auc": None, "status": f"failed: {msg}", "machine": machine(),
                   "command": args.command}  # fmt: skip
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        line = json.dumps(rec, sort_keys=True)
        print(summary(rec), flush=True)
        if args.output is not None:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            with open(args.output, "a") as f:
                f.write(line + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
