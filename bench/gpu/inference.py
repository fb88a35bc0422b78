#!/usr/bin/env python
"""Inference benchmark: hetgmp's serving path against plain PyTorch, per batch size.

    python bench/gpu/inference.py                      # one GPU if present, and the CPU
    python bench/gpu/inference.py --quick --devices cpu   # reduced smoke run (tests, laptops)

Workload: Criteo Kaggle cardinalities (33.8M rows at ``--card-scale 1``), 26 fields, 13 dense
features, ids ``floor(u^4 * card)`` per field (skewed), WDL (``--model``), embedding dim 128; the
weights are random (speed does not depend on them). Inputs are resident on the device.

Contenders, all on the same table tensor:

* ``hetgmp``: :class:`hetgmp.serve.Scorer` as ``hetgmp.serve.load`` builds it: the exported
  ``torch.export`` program (``dense.pt2``, saved and loaded back) over rows gathered from the
  table; ``hetgmp+compile`` the same gather + program under ``torch.compile``; ``+graph``
  (CUDA) captured as one CUDA graph per batch size;
* ``torch``: the model a PyTorch user writes (``nn.Embedding`` + the same layers), eager,
  ``+compile`` and ``+compile+graph`` (``mode="reduce-overhead"``: CUDA graphs).

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
    program = DenseProgram(head).eval()
    with tempfile.TemporaryDirectory() as tmp:
        export_program(program, Path(tmp) / "dense.pt2", dim)
        exported = load_program(Path(tmp) / "dense.pt2", device)
    fields_meta = [
        {"name": f"C{i + 1}", "cardinality": int(c), "offset": int(o)}
        for i, (c, o) in enumerate(zip(cards, offsets, strict=True))
    ]
    manifest = {"num_rows": num_rows, "num_fields": fields, "num_dense": NUM_DENSE}
    scorer = Scorer(
        Path("."), {**manifest, "fields": fields_meta}, exported, DeviceRows(table, device), None
    )
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
        "scorer": scorer,
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
    scorer, plain, table, program = w["scorer"], w["plain"], w["table"], w["scorer"].program

    def ours(ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return scorer.score(ids, dense, check=False)

    def ours_fused(ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(program(table[ids], dense).reshape(-1))

    def theirs(ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(plain(ids, dense).reshape(-1))

    out: dict[str, Callable[..., Any]] = {"hetgmp": ours, "torch": theirs}
    cuda = device.type == "cuda"
    out["hetgmp+compile"] = torch.compile(ours_fused, dynamic=False)
    out["torch+compile"] = torch.compile(theirs, dynamic=False)
    if cuda:
        out["hetgmp+graph"] = ("graph", ours)  # type: ignore[assignment]
        out["torch+compile+graph"] = torch.compile(theirs, mode="reduce-overhead", dynamic=False)
    return out


def cuda_graphed(
    fn: Callable[..., Any], ids: torch.Tensor, dense: torch.Tensor
) -> Callable[..., Any]:
    """``fn`` captured as one CUDA graph for these shapes; inputs are copied into its buffers."""
    s_ids, s_dense = ids.clone(), dense.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(3):
            fn(s_ids, s_dense)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        s_out = fn(s_ids, s_dense)

    def run(i: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        s_ids.copy_(i, non_blocking=True)
        s_dense.copy_(d, non_blocking=True)
        graph.replay()
        return s_out

    return run


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
        t = time.perf_counter()
        for _ in range(reps):
            fn(ids, dense)
        _sync(device)
        total = time.perf_counter() - t
    ms = np.array(lat) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "samples_per_s": ids.shape[0] * reps / total,
        "calls": reps,
    }


def run_device(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    w = build(args, device)
    fns = contenders(w, device)
    bw = copy_bandwidth(device)
    records, gathers = [], []
    for b in args.batches:
        ids, dense = w["ids"][:b].contiguous(), w["dense"][:b].contiguous()
        for name, fn in fns.items():
            try:
                f = cuda_graphed(fn[1], ids, dense) if isinstance(fn, tuple) else fn
                rec = measure(f, ids, dense, device, args)
            except Exception as err:  # noqa: BLE001 - a contender that cannot run is reported
                rec = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
            records.append({"contender": name, "batch": b, **rec})
            print(json.dumps(records[-1]), flush=True)
        g = measure(lambda i, d: w["table"][i], ids, dense, device, args)
        floor_ms = 2.0 * b * w["fields"] * w["dim"] * 4 / bw * 1e3
        gathers.append({"batch": b, "gather_ms": g["mean_ms"], "floor_ms": floor_ms})
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
    lines += [
        "",
        "Best of each side (throughput):",
        "",
        "| batch | hetgmp | torch | ratio |",
        "|---|---|---|---|",
    ]
    for b in sorted({r["batch"] for r in res["records"]}):
        ok = [r for r in res["records"] if r["batch"] == b and "error" not in r]
        ours = max(
            (r["samples_per_s"] for r in ok if r["contender"].startswith("hetgmp")), default=0
        )
        theirs = max(
            (r["samples_per_s"] for r in ok if r["contender"].startswith("torch")), default=0
        )
        ratio = ours / theirs if theirs else float("nan")
        lines.append(f"| {b} | {ours:.3g} | {theirs:.3g} | {ratio:.2f} |")
    lines += [
        "",
        f"Row gather alone vs its floor (read + write of B x F x D fp32 rows at the measured "
        f"copy bandwidth, {res['copy_bandwidth_gbps']:.0f} GB/s):",
        "",
        "| batch | gather ms | floor ms | gather / floor |",
        "|---|---|---|---|",
    ]
    for g in res["gathers"]:
        lines.append(
            f"| {g['batch']} | {g['gather_ms']:.3f} | {g['floor_ms']:.3f} | "
            f"{g['gather_ms'] / g['floor_ms']:.1f} |"
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
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--quick", action="store_true", help="smoke run: tiny table, dim 16, batches 1 64 256"
    )
    p.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    args = p.parse_args(argv)
    if args.quick:
        args.card_scale, args.dim, args.batches = 0.0005, 16, [1, 64, 256]
        args.iters, args.seconds, args.warmup = 10, 0.5, 2
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
