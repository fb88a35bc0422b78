"""Rows from host memory to the GPU and back: zero-copy kernels against batched copies (issue 33:
"gathers of missed rows from pinned memory by the GPU (zero-copy or batched copies: measure
which)"). One GPU::

    python3 bench/gpu/uva_gather.py --rows 8000000 --dim 128 --out uva_gather.md

For ``k`` random distinct rows of a ``[rows, dim]`` float32 table in pinned host memory, the
time per call (CUDA events, after warm-up) of:

* ``zero-copy take``: our row-gather kernel (``take_rows``, Triton) reading the rows through a
  device view of the host memory (:func:`hetgmp.embedding.uva.device_view`), device-side ids;
* ``zero-copy index_select``: torch's gather on the same view;
* ``batched copy``: the host gathers the rows into a pinned buffer (``index_select``), then one
  asynchronous host-to-device copy (host and device time together: the ids must be on the host);
* ``zero-copy put``: the write-back, our row-scatter kernel (``put_rows``) into host memory.

A diagnosis: the host tier's step would run the zero-copy kernels inside its CUDA graph.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu.timing import timed  # noqa: E402
from hetgmp.embedding.kernels import put_rows, take_rows  # noqa: E402
from hetgmp.embedding.uva import device_view  # noqa: E402


def measure(host: torch.Tensor, k: int, iters: int) -> dict[str, float]:
    dev = torch.device("cuda")
    rows, dim = host.shape
    view = device_view(host, dev)
    idx = torch.randperm(rows, device=dev)[:k]
    idx_host = idx.cpu()
    out = torch.empty(k, dim, device=dev)
    staging = torch.empty(k, dim).pin_memory()
    src = torch.randn(k, dim, device=dev)

    def batched() -> None:
        torch.index_select(host, 0, idx_host, out=staging)
        out.copy_(staging, non_blocking=True)

    expect = host.index_select(0, idx_host).to(dev)
    res = {"zero-copy take": timed(lambda: take_rows(view, idx, out=out, backend="triton"), iters)}
    assert torch.equal(out, expect)
    out.zero_()
    res["zero-copy index_select"] = timed(lambda: torch.index_select(view, 0, idx, out=out), iters)
    assert torch.equal(out, expect)
    out.zero_()
    res["batched copy"] = timed(batched, iters)
    torch.cuda.synchronize()
    assert torch.equal(out, expect)
    res["zero-copy put"] = timed(lambda: put_rows(view, idx, src, backend="triton"), iters)
    torch.cuda.synchronize()
    assert torch.equal(host.index_select(0, idx_host), src.cpu())  # (written in place)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--ks", default="1024,4096,16384,65536", help="rows per call")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default="uva_gather.md")
    args = ap.parse_args()
    t0 = time.perf_counter()
    host = torch.randn(args.rows, args.dim).pin_memory()
    pin_s = time.perf_counter() - t0
    gpu = torch.cuda.get_device_name()
    lines = [
        f"machine: {platform.node()} ({gpu}); date: {time.strftime('%Y-%m-%d %H:%M')}",
        f"command: python3 bench/gpu/uva_gather.py --rows {args.rows} --dim {args.dim} "
        f"--ks {args.ks} --iters {args.iters} (table pinned in {pin_s:.1f} s)",
        "",
        "| rows per call | MB | method | us per call | GB/s |",
        "|---|---|---|---|---|",
    ]
    for k in (int(x) for x in args.ks.split(",")):
        mb = k * args.dim * 4 / 1e6
        for name, us in measure(host, k, args.iters).items():
            lines.append(f"| {k} | {mb:.1f} | {name} | {us:.1f} | {mb / us * 1e3:.1f} |")
    text = "\n".join(lines)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
