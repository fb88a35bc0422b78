"""Whether a copy into a peer's memory runs beside a GEMM without slowing it (issue 30), a
diagnosis for ``peer_allreduce.ADAM_COPY``::

    torchrun --standalone --nproc_per_node 2 bench/gpu/copy_engine_probe.py --out ce.md

Why: in the 2-GPU step the dense all-reduce (~1M parameters, 4 MB at WDL dim 128) runs after
the first layer's deferred weight product; NCCL's kernels beside that product slowed it more
than they hid (``dense_sync.EARLY_ROWS``, -6 %, ``bench/results/gpu/own_split/``). A plain
device-to-device copy into a peer's symmetric-memory buffer may be moved by the GPUs' copy
engines instead of SMs. Each piece is captured in a CUDA graph and timed alone and beside the
product (two streams, one graph): the copy of ``--mb`` MB into the peer's buffer, NCCL's
all-reduce of the same bytes, and the product (``[--batch, --k]^T x [--batch, --n]``). If the
copy runs on copy engines, "product + copy" takes about as long as the product alone.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from hetgmp.comm.launch import init_distributed, shutdown
from hetgmp.comm.peer_memory import PeerMemory


def timed(graph: torch.cuda.CUDAGraph, iters: int, env_group: object) -> float:
    """Microseconds per replay (ranks start together: a barrier first)."""
    dist.barrier(group=env_group)  # type: ignore[arg-type]
    torch.cuda.synchronize()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def captured(*parts: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """One graph running ``parts`` side by side, each on a stream of its own."""
    for p in parts:  # (warm up eagerly: kernels chosen, the barrier's first use)
        p()
    torch.cuda.synchronize()
    main = torch.cuda.current_stream()
    streams = [torch.cuda.Stream() for _ in parts]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cap = torch.cuda.current_stream()
        for s, p in zip(streams, parts, strict=True):
            s.wait_stream(cap)
            with torch.cuda.stream(s):
                p()
        for s in streams:
            cap.wait_stream(s)
    main.synchronize()
    return graph


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=4.0, help="bytes copied / all-reduced, MB")
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--k", type=int, default=3328, help="the product's rows (first layer's in)")
    ap.add_argument("--n", type=int, default=256, help="the product's columns (its outputs)")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    env = init_distributed(device="cuda")
    dev, w, me = env.device, env.world_size, env.rank
    numel = int(args.mb * 1e6 / 4)
    pm = PeerMemory(env, {"inbox": ((w, numel), torch.float32)})
    src = torch.full((numel,), float(me + 1), device=dev)  # (checked at the peers)
    outs = [pm.peer("inbox", r)[me] for r in range(w) if r != me]
    nccl = torch.randn(numel, device=dev)
    x = torch.randn(args.batch, args.k, device=dev)
    dy = torch.randn(args.batch, args.n, device=dev)
    dw = torch.empty(args.k, args.n, device=dev)

    def copy() -> None:
        for o in outs:
            o.copy_(src)

    def all_reduce() -> None:
        dist.all_reduce(nccl, group=env.group)

    def product() -> None:
        torch.mm(x.t(), dy, out=dw)

    rows = []
    for name, parts in [
        ("product", (product,)), ("copy to peers", (copy,)), ("NCCL all-reduce", (all_reduce,)),
        ("product + copy", (product, copy)), ("product + all-reduce", (product, all_reduce)),
    ]:  # fmt: skip
        rows.append((name, timed(captured(*parts), args.iters, env.group)))
    pm.barrier()
    torch.cuda.synchronize()
    ok = all(bool((pm.mine("inbox")[r] == r + 1).all()) for r in range(w) if r != me)
    if me == 0:
        lines = [
            f"# copy engine probe ({platform.node()}, {torch.cuda.get_device_name(dev)}, "
            f"{w} ranks, {time.strftime('%Y-%m-%d %H:%M')})", "",
            f"{args.mb} MB copied to each peer / all-reduced; product [{args.batch}x{args.k}]^T "
            f"x [{args.batch}x{args.n}]; CUDA graphs, {args.iters} replays", "",
            "| graph | us |", "|---|---|",
            *[f"| {n} | {t:.1f} |" for n, t in rows], "",
            f"inboxes written by the peers: {ok}",
        ]  # fmt: skip
        text = "\n".join(lines) + "\n"
        print(text, flush=True)
        if args.out is not None:
            args.out.write_text(text)
    shutdown(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
