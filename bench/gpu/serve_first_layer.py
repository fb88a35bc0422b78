"""WDL's first layer (the deep part's 256 columns and the wide logit over ``[rows, dense]``) at
serving batch sizes, a diagnosis of :mod:`hetgmp.serve.first_layer` (the user-facing figure is
``bench/gpu/inference.py``). Each way includes the row gather ``table[ids]``:

- ``training``: :func:`hetgmp.models.layers.first_layer` as training runs it (weights
  concatenated per call, outputs padded to 264 columns), eager; ``training_compiled``: the
  same under ``torch.compile`` (what the scorer ran before :mod:`hetgmp.serve.first_layer`);
- ``inference``: :class:`~hetgmp.serve.first_layer.InferenceFirstLayer` under ``torch.compile``
  (what the scorer runs);
- ``training_tf32``: ``training`` with TF32 products allowed (context: faster, less exact).

Per batch: GPU ms per call (a CUDA graph of one call, replayed ``--iters`` times), the largest
absolute difference from a float64 reference, and with ``--profile`` each way's kernels.

    python bench/gpu/serve_first_layer.py --out-dir bench/results/gpu
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make `bench.gpu` and `hetgmp` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.data import cardinalities  # noqa: E402
from bench.gpu.timing import machine_info  # noqa: E402
from hetgmp.models.layers import first_layer  # noqa: E402
from hetgmp.serve.first_layer import InferenceFirstLayer  # noqa: E402

DENSE, HIDDEN = 13, 256


def timed(fn: Any, iters: int) -> float:
    """Mean ms of ``fn()`` replayed ``iters`` times back to back as one CUDA graph (pure GPU
    time: a single call at batch 1024 is shorter than its launches)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        graph.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def kernels(fn: Any) -> list[tuple[str, float]]:
    """(kernel name, us) of one call, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    avg = prof.key_averages()
    return [(e.key[:90], e.device_time_total) for e in avg if e.device_time_total > 0]


def run(args: argparse.Namespace) -> dict[str, Any]:
    dev = torch.device("cuda")
    cards = cardinalities(args.card_scale)
    offsets = np.concatenate([[0], np.cumsum(cards)[:-1]])
    torch.manual_seed(0)
    table = (torch.rand(int(cards.sum()), args.dim, device=dev) - 0.5) * 0.02
    width = len(cards) * args.dim
    lins = [nn.Linear(width + DENSE, HIDDEN), nn.Linear(width + DENSE, 1)]
    lins = [lin.to(dev).eval() for lin in lins]
    rng = np.random.default_rng(0)
    records = []
    for b in args.batches:
        ids_np = np.floor(rng.random((b, len(cards))) ** 4 * cards).astype(np.int64) + offsets
        ids = torch.from_numpy(ids_np).to(dev)
        records += measure_batch(ids, torch.rand(b, DENSE, device=dev), table, lins, args)
    return {"machine": machine_info(dev), "records": records, "command": " ".join(sys.argv)}


def reference(
    ids: torch.Tensor, dense: torch.Tensor, table: torch.Tensor, lins: list[nn.Linear]
) -> torch.Tensor:
    """The layers' outputs in float64: ``[flat rows, dense] @ W^T + b``."""
    x = torch.cat([table[ids].reshape(ids.shape[0], -1), dense], 1).double()
    return torch.cat([x @ lin.weight.double().t() + lin.bias.double() for lin in lins], 1)


def measure_batch(
    ids: torch.Tensor, dense: torch.Tensor, table: torch.Tensor, lins: list[nn.Linear],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every way at one batch: ms and the largest error against float64."""
    b, f = ids.shape
    ref = reference(ids, dense, table, lins)
    first = InferenceFirstLayer(lins, f * table.shape[1]).to(table.device)
    ways: dict[str, Any] = {"training": lambda: first_layer(table[ids], dense, lins)}
    ways["training_compiled"] = torch.compile(ways["training"], dynamic=False)
    ways["inference"] = torch.compile(lambda: first(table[ids], dense), dynamic=False)
    ways["training_tf32"] = ways["training"]
    records = []
    with torch.inference_mode():
        for name, fn in ways.items():
            torch.backends.cuda.matmul.allow_tf32 = name.endswith("tf32")
            out = fn()[:, : HIDDEN + 1].double()
            rec = {"way": name, "batch": b, "ms": timed(fn, args.iters),
                   "max_abs_err": float((out - ref).abs().max())}  # fmt: skip
            if args.profile:
                rec["kernels"] = kernels(fn)
            torch.backends.cuda.matmul.allow_tf32 = False
            records.append(rec)
            print(json.dumps(rec), flush=True)
    return records


def report_md(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [f"# WDL's first layer at serving batch sizes: {m.get('gpu')}", "",
             f"{m['date']}, torch {m['torch']}; command `{res['command']}`", "",
             "| batch | way | ms | speed vs training_compiled | max abs err vs float64 |", "|---|---|---|---|---|"]  # fmt: skip
    base = {r["batch"]: r["ms"] for r in res["records"] if r["way"] == "training_compiled"}
    for r in res["records"]:
        ratio = base[r["batch"]] / r["ms"]
        lines.append(f"| {r['batch']} | {r['way']} | {r['ms']:.4f} | {ratio:.2f}x | "
                     f"{r['max_abs_err']:.2e} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 1024, 8192, 65536])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--card-scale", type=float, default=1.0)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--profile", action="store_true", help="list each way's kernels (JSON lines)")
    p.add_argument("--out-dir", type=Path, default=None)
    args = p.parse_args(argv)
    res = run(args)
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "serve_first_layer.json").write_text(json.dumps(res, indent=2))
        (args.out_dir / "serve_first_layer.md").write_text(report_md(res))
    print(report_md(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
