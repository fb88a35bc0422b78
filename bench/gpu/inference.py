#!/usr/bin/env python
"""Inference benchmark: hetgmp's serving path against plain PyTorch, per batch size.

    python bench/gpu/inference.py                      # one GPU if present, and the CPU
    python bench/gpu/inference.py --quick --devices cpu   # reduced smoke run (tests, laptops)

Workload: Criteo Kaggle cardinalities (33.8M rows at ``--card-scale 1``), 26 fields, 13 dense
features, ids ``floor(u^4 * card)`` per field (skewed), WDL (``--model``), embedding dim 128; the
weights are random (speed does not depend on them). Inputs are resident on the device.

Contenders, all on the same table tensor:

* ``hetgmp``: :class:`hetgmp.serve.Scorer` over the exported ``torch.export`` program
  (``dense.pt2``, saved and loaded back), uncompiled, rows gathered from the table
  (``compile=False``); ``+model`` (CPU): the dense part rebuilt from the program's weights in
  this hetgmp's model code, uncompiled (``hetgmp.serve.load``'s default on a CPU);
  ``+compile``: the fast path of :mod:`hetgmp.serve.compiled` (the dense part rebuilt from the
  program's weights under ``torch.compile``, per power-of-two batch bucket); ``+graph`` (CUDA):
  the scorer's own CUDA graph per bucket; ``+compile+graph`` is what ``hetgmp.serve.load``
  gives on CUDA; ``+bf16rows``: the same over a bf16 table (``hetgmp export --dtype bf16``;
  scores differ by ~1e-3, so it is left out of the best-of comparison); ``+amp``: bf16 rows and
  the dense part under bf16 autocast (``load(amp=True)``, as training's ``--amp``);
* ``torch``: the model a PyTorch user writes (``nn.Embedding`` + the same layers), eager,
  ``+compile`` and ``+compile+graph`` (``mode="reduce-overhead"``: CUDA graphs), and its best
  compiled form under bf16 autocast (``+amp``).

Best-of tables compare like with like: float32 on both sides, and autocast on both sides.

Per (contender, batch): latency of single calls synchronised each (p50 / p99 / mean) and
throughput of back-to-back calls (one sync at the end). The row gather alone is timed too and set
against its HBM floor (read + write of ``B x F x D`` rows at the measured copy bandwidth).
Results: ``bench/results/serving_<device>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make `bench.gpu` and `hetgmp` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.data import cardinalities  # noqa: E402
from bench.gpu.timing import copy_bandwidth, machine_info  # noqa: E402
from hetgmp.models import build_model, model_class  # noqa: E402
from hetgmp.serve.compiled import build_fast_path  # noqa: E402
from hetgmp.serve.program import (  # noqa: E402
    DenseProgram,
    RowsIdentity,
    export_program,
    load_program,
)
from hetgmp.serve.rows import DeviceRows  # noqa: E402
from hetgmp.serve.scorer import Scorer  # noqa: E402

BATCHES = (1, 64, 1024, 8192, 65536)
NUM_DENSE = 13


def _scorers(
    args: argparse.Namespace, head: DenseProgram, table: torch.Tensor, meta: dict[str, Any],
    device: torch.device,
) -> dict[str, Scorer]:  # fmt: skip
    """hetgmp's contenders: one Scorer per (compile, CUDA graphs, row dtype), as
    ``hetgmp.serve.load`` builds them, over the exported program saved and loaded back."""
    with tempfile.TemporaryDirectory() as tmp:
        export_program(head, Path(tmp) / "dense.pt2", meta["table_dim"])
        exported = load_program(Path(tmp) / "dense.pt2", device)
    cuda = device.type == "cuda"
    variants: dict[str, tuple[Any, bool, str]] = {"hetgmp": (False, False, "fp32")}
    if not cuda:  # (the CPU default: the rebuilt model code, uncompiled)
        variants["hetgmp+model"] = ("auto", False, "fp32")
    variants["hetgmp+compile"] = (True, False, "fp32")
    if cuda:
        variants["hetgmp+graph"] = (False, True, "fp32")
        variants["hetgmp+compile+graph"] = (True, True, "fp32")
    best = "hetgmp+compile+graph" if cuda else "hetgmp+compile"
    variants[f"{best}+bf16rows"] = (True, cuda, "bf16")
    variants[f"{best}+amp"] = (True, cuda, "bf16")  # + the dense part under bf16 autocast
    tables = {"fp32": table, "bf16": table.to(torch.bfloat16)}
    out = {}
    for name, (comp, graphs, dtype) in variants.items():
        fast = build_fast_path(
            exported, meta, tables[dtype], None, device, compile=comp, cuda_graphs=graphs,
            mode=args.compile_mode, amp=name.endswith("+amp"),
        )  # fmt: skip
        rows = DeviceRows(tables[dtype], device)
        out[name] = Scorer(Path("."), meta, exported, rows, None, fast)
    return out


def build(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The table, the ids, the dense head (random weights) and both contenders' modules."""
    cards = cardinalities(args.card_scale)
    offsets = np.concatenate([[0], np.cumsum(cards)[:-1]])
    num_rows, fields = int(cards.sum()), len(cards)
    torch.manual_seed(0)
    dim = model_class(args.model).table_dim(args.dim)
    table = (torch.rand(num_rows, dim, device=device) - 0.5) * 0.02
    head = build_model(
        args.model, RowsIdentity(), num_fields=fields, num_dense=NUM_DENSE, embed_dim=args.dim
    ).eval()
    meta = {
        "model": args.model, "embed_dim": args.dim, "table_dim": dim, "num_rows": num_rows,
        "num_fields": fields, "num_dense": NUM_DENSE,
        "fields": [
            {"name": f"C{i + 1}", "cardinality": int(c), "offset": int(o)}
            for i, (c, o) in enumerate(zip(cards, offsets, strict=True))
        ],
    }  # fmt: skip
    scorers = _scorers(args, DenseProgram(head).eval(), table, meta, device)
    plain = build_model(
        args.model,
        nn.Embedding.from_pretrained(table, freeze=True),
        num_fields=fields,
        num_dense=NUM_DENSE,
        embed_dim=args.dim,
    )
    plain.load_dense_state_dict(head.dense_state_dict())
    plain = plain.to(device).eval()
    rng = np.random.default_rng(0)
    n = max(args.batches)
    ids = np.floor(rng.random((n, fields)) ** 4 * cards).astype(np.int64) + offsets
    return {
        "scorers": scorers,
        "plain": plain,
        "table": table,
        "ids": torch.from_numpy(ids).to(device),
        "dense": torch.rand(n, NUM_DENSE, device=device),
        "num_rows": num_rows,
        "fields": fields,
        "dim": dim,
    }


def contenders(w: dict[str, Any], device: torch.device) -> dict[str, Callable[..., Any]]:
    """name -> fn(ids, dense) -> probabilities."""
    plain = w["plain"]

    def ours(scorer: Scorer) -> Callable[..., Any]:
        return lambda ids, dense: scorer.score(ids, dense, check=False)

    def theirs(ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(plain(ids, dense).reshape(-1))

    def theirs_amp(ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return torch.sigmoid(plain(ids, dense).reshape(-1).float())

    out: dict[str, Callable[..., Any]] = {k: ours(s) for k, s in w["scorers"].items()}
    out["torch"] = theirs
    out["torch+compile"] = torch.compile(theirs, dynamic=False)
    if device.type == "cuda":
        out["torch+compile+graph"] = torch.compile(theirs, mode="reduce-overhead", dynamic=False)
    best, mode = (
        ("+compile+graph", "reduce-overhead") if device.type == "cuda" else ("+compile", None)
    )
    out[f"torch{best}+amp"] = torch.compile(theirs_amp, mode=mode, dynamic=False)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    fn: Callable[..., Any],
    ids: torch.Tensor,
    dense: torch.Tensor,
    device: torch.device,
    args: argparse.Namespace,
) -> dict[str, float]:
    """Latency percentiles (synchronised single calls) and throughput (back-to-back calls)."""
    with torch.inference_mode():
        for _ in range(args.warmup):
            fn(ids, dense)
        _sync(device)
        lat = []
        budget = time.perf_counter() + args.seconds
        while len(lat) < args.iters and (len(lat) < 5 or time.perf_counter() < budget):
            t = time.perf_counter()
            fn(ids, dense)
            _sync(device)
            lat.append(time.perf_counter() - t)
        reps = len(lat)
        total = float("inf")
        for _ in range(args.rounds):  # (best round: the machine is shared, noise is one-sided)
            t = time.perf_counter()
            for _ in range(reps):
                fn(ids, dense)
            _sync(device)
            total = min(total, time.perf_counter() - t)
    ms = np.array(lat) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "samples_per_s": ids.shape[0] * reps / total,
        "calls": reps,
    }


def _gather(
    w: dict[str, Any], ids: torch.Tensor, dense: torch.Tensor, device: torch.device,
    args: argparse.Namespace, bw: float,
) -> dict[str, Any]:  # fmt: skip
    """The row gather alone (``table[ids]``, and ``index_select`` of the flat ids), fp32 and
    bf16 rows, and its floor (read + write at ``bw``)."""
    bf16 = next(s.rows.table for s in w["scorers"].values() if s.rows.table.dtype != torch.float32)
    out: dict[str, Any] = {"batch": ids.shape[0]}
    for key, table in (("", w["table"]), ("bf16_", bf16)):
        g = measure(lambda i, d, t=table: t[i], ids, dense, device, args)
        out[f"{key}gather_ms"] = g["mean_ms"]
        nbytes = 2.0 * ids.numel() * w["dim"] * table.element_size()
        out[f"{key}floor_ms"] = nbytes / bw * 1e3
    g = measure(lambda i, d: w["table"].index_select(0, i.reshape(-1)), ids, dense, device, args)
    out["index_select_ms"] = g["mean_ms"]
    return out


def run_device(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    w = build(args, device)
    fns = contenders(w, device)
    bw = copy_bandwidth(device)
    records, gathers = [], []
    for b in args.batches:
        ids, dense = w["ids"][:b].contiguous(), w["dense"][:b].contiguous()
        for name, fn in fns.items():
            try:
                rec = measure(fn, ids, dense, device, args)
            except Exception as err:  # noqa: BLE001 - a contender that cannot run is reported
                rec = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
            records.append({"contender": name, "batch": b, **rec})
            print(json.dumps(records[-1]), flush=True)
        gathers.append(_gather(w, ids, dense, device, args, bw))
    return {
        "machine": machine_info(device),
        "workload": {
            "model": args.model,
            "dim": args.dim,
            "num_rows": w["num_rows"],
            "fields": w["fields"],
            "num_dense": NUM_DENSE,
            "card_scale": args.card_scale,
        },  # fmt: skip
        "copy_bandwidth_gbps": bw / 1e9,
        "records": records,
        "gathers": gathers,
        "command": " ".join(sys.argv),
    }


def _best_of(res: dict[str, Any], title: str, keep: Callable[[str], bool]) -> list[str]:
    """Markdown lines: the best throughput of each side per batch, among contenders ``keep``."""
    lines = ["", f"Best of each side (throughput; {title}):", "",
             "| batch | hetgmp | torch | ratio |", "|---|---|---|---|"]  # fmt: skip
    for b in sorted({r["batch"] for r in res["records"]}):
        ok = [r for r in res["records"] if r["batch"] == b and "error" not in r]
        ok = [r for r in ok if keep(r["contender"])]
        best = {
            side: max(
                (r["samples_per_s"] for r in ok if r["contender"].startswith(side)), default=0
            )
            for side in ("hetgmp", "torch")
        }
        ratio = best["hetgmp"] / best["torch"] if best["torch"] else float("nan")
        lines.append(f"| {b} | {best['hetgmp']:.3g} | {best['torch']:.3g} | {ratio:.2f} |")
    return lines


def report_md(res: dict[str, Any]) -> str:
    m, wl = res["machine"], res["workload"]
    lines = [
        f"# Serving inference: {m.get('gpu') or 'CPU'} ({m['device']})",
        "",
        f"{m['date']}, torch {m['torch']}, {m['cpus']} cpus; model {wl['model']} dim "
        f"{wl['dim']}, {wl['num_rows']} rows, {wl['fields']} fields, {wl['num_dense']} dense; "
        f"command `{res['command']}`",
        "",
        "| batch | contender | samples/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|",
    ]
    for r in res["records"]:
        if "error" in r:
            lines.append(f"| {r['batch']} | {r['contender']} | error: {r['error']} | | |")
        else:
            lines.append(
                f"| {r['batch']} | {r['contender']} | {r['samples_per_s']:.3g} | "
                f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} |"
            )
    lines += _best_of(res, "fp32 on both sides", lambda n: "bf16" not in n and "amp" not in n)
    lines += _best_of(res, "the dense part under bf16 autocast on both sides", lambda n: "amp" in n)
    lines += [
        "",
        f"Row gather alone vs its floor (read + write of B x F x D rows at the measured "
        f"copy bandwidth, {res['copy_bandwidth_gbps']:.0f} GB/s):",
        "",
        "| batch | gather ms | index_select ms | floor ms | gather / floor | bf16 gather ms "
        "| bf16 floor ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in res["gathers"]:
        lines.append(
            f"| {g['batch']} | {g['gather_ms']:.3f} | {g['index_select_ms']:.3f} | "
            f"{g['floor_ms']:.3f} | {g['gather_ms'] / g['floor_ms']:.1f} | "
            f"{g['bf16_gather_ms']:.3f} | {g['bf16_floor_ms']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--devices", default="auto", help="cuda,cpu / cpu / cuda (auto: both, cuda if present)"
    )
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--model", default="wdl")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--card-scale", type=float, default=1.0, help="x Criteo cardinalities")
    p.add_argument("--iters", type=int, default=200, help="most timed calls per point")
    p.add_argument("--seconds", type=float, default=2.0, help="time budget per point")
    p.add_argument(
        "--rounds", type=int, default=3,
        help="throughput: best of this many rounds of back-to-back calls (as many calls as "
        "the latency loop made)",
    )  # fmt: skip
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--compile-mode", default=None, help="torch.compile mode of hetgmp's compiled scorers"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: tiny table, dim 16, batches 1 64 256 (unless given)",
    )
    p.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    args = p.parse_args(argv)
    if args.quick:  # (options given explicitly keep their value)
        quick = {"card_scale": 0.0005, "dim": 16, "batches": [1, 64, 256], "iters": 10,
                 "seconds": 0.5, "warmup": 2}  # fmt: skip
        for key, value in quick.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
    names = args.devices.split(",") if args.devices != "auto" else ["cuda", "cpu"]
    devices = [torch.device(n) for n in names if n != "cuda" or torch.cuda.is_available()]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for device in devices:
        res = run_device(args, device)
        tag = "cuda" if device.type == "cuda" else "cpu"
        (args.out_dir / f"serving_{tag}.json").write_text(json.dumps(res, indent=2))
        (args.out_dir / f"serving_{tag}.md").write_text(report_md(res))
        print(f"wrote {args.out_dir / f'serving_{tag}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
