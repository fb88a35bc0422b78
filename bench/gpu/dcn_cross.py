"""DCN's cross network + its output projection, forward + backward, three ways on one GPU:

- ``eager``: hetgmp's torch path (``--kernels torch``): concatenate ``[emb, dense]``, upcast to
  float32, the layers one by one, then ``F.linear`` with the output layer's cross columns;
- ``compile``: the same function through ``torch.compile`` (the plain contender's way);
- ``triton``: :func:`hetgmp.models.cross.cross_logit` on the fused kernels (``--kernels auto``
  on CUDA), for the default tiles and a few others (``--sweep``).

Inputs as the CLI has them: rows ``[B, F, D]`` in bf16 (autocast, the CUDA default) or float32
(``--dtypes``), dense features float32, cross weights float32. Gradients go to the rows and
every weight. Reports ms per forward + backward (CUDA events, median of ``--iters``), the
bandwidth it implies against the floor of the fused way (read the rows twice, write their
gradient once), and the largest difference from ``eager``.

    python bench/gpu/dcn_cross.py --out-dir bench/results/gpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from hetgmp.models.cross import Tiles, cross_logit, default_tiles

FIELDS, DIM, DENSE, LAYERS = 26, 128, 13, 3  # WDL-128 Criteo shape: width 26 * 128 + 13 = 3341
SWEEP = [Tiles(16, 256, 16, 128), Tiles(8, 512, 32, 128), Tiles(32, 128, 16, 256),
         Tiles(16, 256, 32, 64, 4096), Tiles(16, 512, 16, 128, 1024)]  # fmt: skip


def layers_torch(emb, dense, ws, bs, u):  # noqa: ANN001, ANN201 - (compiled as is)
    """hetgmp's ``--kernels torch`` DCN cross logit (``DCN._cross_logit``)."""
    flat = emb.reshape(emb.shape[0], emb.shape[1] * emb.shape[2])
    x0 = torch.cat([flat, dense.to(flat.dtype)], dim=1).float()
    x = x0
    for w, b in zip(ws, bs, strict=True):
        x = x0 * (x @ w).unsqueeze(1) + b + x
    return F.linear(x, u[None]).squeeze(1)


def inputs(batch: int, dtype: torch.dtype) -> tuple[list[torch.Tensor], torch.Tensor]:
    dev = torch.device("cuda")
    k = FIELDS * DIM + DENSE
    emb = (torch.randn(batch, FIELDS, DIM, device=dev) * 0.1).to(dtype).requires_grad_()
    dense = torch.rand(batch, DENSE, device=dev)
    ws = [(torch.randn(k, device=dev) * 0.01).requires_grad_() for _ in range(LAYERS)]
    bs = [(torch.randn(k, device=dev) * 0.01).requires_grad_() for _ in range(LAYERS)]
    u = (torch.randn(k, device=dev) * 0.02).requires_grad_()
    return [emb, dense, *ws, *bs, u], torch.randn(batch, device=dev)


def step_fn(way: str, tiles: Tiles | None = None) -> Any:
    """One forward + backward of ``way`` on the inputs: returns the logits."""
    if way == "triton":

        def fwd(emb, dense, ws, bs, u):  # noqa: ANN001, ANN202
            flat = emb.reshape(emb.shape[0], emb.shape[1] * emb.shape[2])
            return cross_logit(flat, dense, ws, bs, u, "triton", tiles)

    else:
        fwd = torch.compile(layers_torch) if way == "compile" else layers_torch

    def step(leaves: list[torch.Tensor], gy: torch.Tensor) -> torch.Tensor:
        for t in leaves:
            t.grad = None
        emb, dense, ws, bs, u = leaves[0], leaves[1], leaves[2:5], leaves[5:8], leaves[8]
        y = fwd(emb, dense, ws, bs, u)
        y.backward(gy)
        return y

    return step


def time_ms(step: Any, leaves: list[torch.Tensor], gy: torch.Tensor, iters: int) -> float:
    for _ in range(3):
        step(leaves, gy)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step(leaves, gy)
        b.record()
        times.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in times)


def max_rel_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The largest difference over logits and gradients, relative to each one's largest value."""
    out = 0.0
    for g, w in zip(got, want, strict=True):
        scale = max(float(w.float().abs().max()), 1e-30)
        out = max(out, float((g.float() - w.float()).abs().max()) / scale)
    return out


def measure(batch: int, dtype: torch.dtype, ways: list[tuple[str, Tiles]], iters: int) -> list:
    leaves, gy = inputs(batch, dtype)
    grads = [0, 2, 3, 4, 5, 6, 7, 8]  # (the dense features take no gradient)
    elt = leaves[0].element_size()
    floor_bytes = 3 * batch * FIELDS * DIM * elt  # rows read twice, their gradient written once
    want = None
    rows = []
    for way, tiles in ways:
        step = step_fn(way, tiles)
        ms = time_ms(step, leaves, gy, iters)
        got = [step(leaves, gy).detach(), *(leaves[i].grad for i in grads)]
        if want is None:
            want = [t.clone() for t in got]
        rows.append({
            "batch": batch, "dtype": str(dtype).replace("torch.", ""), "way": way,
            "tiles": list(tiles or default_tiles(dtype)) if way == "triton" else None,
            "default_tiles": way == "triton" and tiles is None, "ms": round(ms, 4),
            "samples_per_s": round(batch / ms * 1e3), "gb_s_vs_floor": round(floor_bytes / ms / 1e6, 1),
            "max_rel_diff_vs_eager": max_rel_diff(got, want),
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
        del step
    return rows


def table(rows: list[dict], device: str) -> str:
    lines = [
        f"# DCN cross network fwd+bwd, width {FIELDS * DIM + DENSE}, {LAYERS} layers, {device}",
        "",
        "| batch | rows | way | tiles | ms | M samples/s | GB/s vs floor | max rel diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['dtype']} | {r['way']} | {r['tiles'] or ''}{' (default)' * r['default_tiles']} | {r['ms']:.3f} | "
            f"{r['samples_per_s'] / 1e6:.2f} | {r['gb_s_vs_floor']} | "
            f"{r['max_rel_diff_vs_eager']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[8192, 65536])
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile way")
    ap.add_argument("--sweep", action="store_true", help="time the kernels' other tile sizes")
    ap.add_argument("--out-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("dcn_cross.py needs a CUDA GPU", file=sys.stderr)
        return 2
    ways: list[tuple[str, Tiles | None]] = [("eager", None)]
    ways += [] if args.no_compile else [("compile", None)]
    ways += [("triton", None)] + [("triton", t) for t in SWEEP * args.sweep]  # None: the default
    rows = []
    for batch in args.batch:
        for name in args.dtypes:
            dtype = torch.bfloat16 if name == "bf16" else torch.float32
            rows += measure(batch, dtype, ways, args.iters)
            torch.cuda.empty_cache()
    device = torch.cuda.get_device_name(0)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "dcn_cross.json").write_text(json.dumps({"device": device, "rows": rows}))
    (args.out_dir / "dcn_cross.md").write_text(table(rows, device))
    print(table(rows, device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
