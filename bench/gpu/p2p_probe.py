"""Peer memory over NVLink against NCCL's all-to-all for the exchange's payloads (issue 30), a
diagnosis for the exchange's redesign (``docs/scaling_plan.md``)::

    torchrun --standalone --nproc_per_node 2 bench/gpu/p2p_probe.py --out p2p_probe.md

Why: the 2-GPU step's chain after backward (pre-sync, pack, all-to-all, the owner's update,
answer, all-to-all, finish: ~155 us at batch 8192 on 2 H100s) is what one GPU does not do. With
the peers' tables mapped into each rank's address space (``torch.distributed._symmetric_memory``:
a buffer every rank allocates, each rank seeing the others'), a reader could gather a remote
row itself and a pusher add its gradient at the owner with atomics: no packing, no NCCL kernels,
a device barrier between the phases. This measures the pieces, on rows of ``--dim`` floats:

* ``remote take``: our row-gather kernel (``take_rows``) reading ``k`` random rows of the peer's
  table through its mapping, against the same gather from the local table;
* ``remote add``: our scatter-add kernel (``scatter_add_rows``, relaxed atomics) adding ``k``
  rows into the peer's buffer;
* ``barrier``: the symmetric memory's device barrier (eager and inside a CUDA graph);
* ``nccl all_to_all``: ``all_to_all_single`` of ``k`` rows to each peer;
* the round trip inside one CUDA graph: pushes by remote add, barrier, reads by remote take,
  barrier; the same rows copied whole into the peer's buffer twice with a barrier after each
  (``padded.peer_payloads``); against two captured all-to-alls of the same payloads.

Every result is checked (the rows read are the peer's, the adds arrive: listed under the
table). Writes a markdown table (rank 0). The environment must leave NVLink multicast off (``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NCCL_NVLS_ENABLE=0``), as on every machine here.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu.timing import timed as _timed  # noqa: E402
from hetgmp.embedding.kernels import scatter_add_rows, take_rows  # noqa: E402


def timed(fn: Callable[[], object], iters: int) -> float:
    """Mean microseconds per call, every rank lined up first (collectives pair up)."""
    return _timed(fn, iters, before=dist.barrier)


def graphed(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` captured as a CUDA graph (after one eager run: first rendezvous and NCCL setup);
    returns its replay."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def probe(k: int, rows: int, dim: int, iters: int, symm: Any, table: torch.Tensor,
          isymm: Any, inbox: torch.Tensor, notes: list[str]) -> dict[str, float]:  # fmt: skip
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = (rank + 1) % world
    dev = table.device
    ptable = symm.get_buffer(peer, (rows, dim), torch.float32)
    pinbox = isymm.get_buffer(peer, (rows, dim), torch.float32)
    g = torch.Generator(device=dev).manual_seed(rank)
    idx = torch.randperm(rows, device=dev, generator=g)[:k]
    out = torch.empty(k, dim, device=dev)
    grad = torch.ones(k, dim, device=dev)
    res = {}
    res["local take"] = timed(lambda: take_rows(table, idx, out=out, backend="triton"), iters)
    res["remote take"] = timed(lambda: take_rows(ptable, idx, out=out, backend="triton"), iters)
    torch.cuda.synchronize()
    want = peer * 1000.0 + idx.to(torch.float32)[:, None].expand(k, dim)
    notes.append(f"k={k}: remote rows are the peer's: {torch.equal(out, want)}")
    inbox.zero_()
    torch.cuda.synchronize()
    dist.barrier()
    scatter_add_rows(pinbox, idx, grad, backend="triton")
    torch.cuda.synchronize()
    dist.barrier()
    got = inbox.sum()
    notes.append(f"k={k}: the peer's adds arrived: {int(got)} of {k * dim}")
    res["remote add"] = timed(lambda: scatter_add_rows(pinbox, idx, grad, backend="triton"), iters)
    res["barrier"] = timed(lambda: symm.barrier(channel=0), iters)
    send = torch.ones(world * k, dim, device=dev)
    recv = torch.empty_like(send)
    res["nccl all_to_all"] = timed(lambda: dist.all_to_all_single(recv, send), iters)

    def p2p_round() -> None:
        scatter_add_rows(pinbox, idx, grad, backend="triton")
        symm.barrier(channel=0)
        take_rows(ptable, idx, out=out, backend="triton")
        symm.barrier(channel=1)

    def nccl_round() -> None:
        dist.all_to_all_single(recv, send)
        dist.all_to_all_single(send, recv)

    # (what padded.peer_payloads does: each payload copied whole into the peer's buffer)
    dst = pinbox[:k]
    block = send[:k]

    def copy_round() -> None:
        dst.copy_(block, non_blocking=True)
        symm.barrier(channel=0)
        dst.copy_(block, non_blocking=True)
        symm.barrier(channel=1)

    res["graph: add, barrier, take, barrier"] = timed(graphed(p2p_round), iters)
    res["graph: copy, barrier, copy, barrier"] = timed(graphed(copy_round), iters)
    res["graph: 2 all_to_all"] = timed(graphed(nccl_round), iters)
    res["graph: barrier"] = timed(graphed(lambda: symm.barrier(channel=0)), iters)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1 << 20, help="rows of each rank's table")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--ks", default="2048,8192,32768", help="rows per peer per call")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--out", default="p2p_probe.md")
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    import torch.distributed._symmetric_memory as symm_mem

    rows, dim = args.rows, args.dim
    dev = torch.device("cuda", local)
    table = symm_mem.empty(rows, dim, dtype=torch.float32, device=dev)
    inbox = symm_mem.empty(rows, dim, dtype=torch.float32, device=dev)
    symm = symm_mem.rendezvous(table, dist.group.WORLD)
    isymm = symm_mem.rendezvous(inbox, dist.group.WORLD)
    table.copy_(dist.get_rank() * 1000.0 + torch.arange(rows, device=dev)[:, None].float())
    torch.cuda.synchronize()
    dist.barrier()
    lines = [
        f"machine: {platform.node()} ({torch.cuda.get_device_name()} x {dist.get_world_size()}); "
        f"date: {time.strftime('%Y-%m-%d %H:%M')}; torch {torch.__version__}",
        f"command: torchrun --nproc_per_node {dist.get_world_size()} bench/gpu/p2p_probe.py "
        f"--rows {rows} --dim {dim} --ks {args.ks} --iters {args.iters}",
        "",
        "| rows per peer | MB per peer | what | us per call (rank 0) |",
        "|---|---|---|---|",
    ]
    notes: list[str] = []
    for k in (int(x) for x in args.ks.split(",")):
        for name, us in probe(k, rows, dim, args.iters, symm, table, isymm, inbox, notes).items():
            lines.append(f"| {k} | {k * dim * 4 / 1e6:.1f} | {name} | {us:.1f} |")
    lines += ["", "Checks (rank 0):", *(f"- {n}" for n in notes)]
    if dist.get_rank() == 0:
        Path(args.out).write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
