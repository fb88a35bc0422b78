"""All-to-all bandwidth of the machine: ``torch.distributed.all_to_all_single`` over message sizes.

    torchrun --standalone --nproc_per_node 8 bench/gpu/alltoall_bw.py --out a2a.json
    mpirun -np 8 python bench/gpu/alltoall_bw.py --device cpu --out a2a.json   # gloo, a test

Every rank sends ``size`` bytes per call, ``size / world`` to each rank (itself included), as
``nccl-tests``' ``alltoall_perf`` does. Per size: ``warmup`` untimed calls, then ``iters`` timed
calls (CUDA events on GPU; the host clock on CPU); the time of a size is the slowest rank's mean.
``algbw = size / time``; ``busbw = algbw * (world - 1) / world`` (the bytes that cross links, so
it compares with a link's bandwidth). On 1 rank the call is a device-local copy: no link is
measured, the record says so. Writes one JSON object (``machine``, ``backend``, ``world``,
``results``: one record per size) on rank 0 and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == HERE:
    sys.path.pop(0)  # run as a script: import bench.gpu.*, not sibling modules by bare name
sys.path.insert(0, str(HERE.parents[1]))

from bench.gpu.timing import machine_info  # noqa: E402
from hetgmp.comm.collectives import all_gather_object  # noqa: E402
from hetgmp.comm.env import DistEnv  # noqa: E402
from hetgmp.comm.launch import init_distributed, shutdown  # noqa: E402

DEFAULT_SIZES_MB = "1,4,16,64,256"


def time_size(env: DistEnv, nbytes: int, warmup: int, iters: int) -> float:
    """This rank's mean seconds per ``all_to_all_single`` of ``nbytes`` bytes sent per rank."""
    w = env.world_size
    n = max(w, nbytes // 4 // w * w)  # float32 elements, a multiple of the world size
    send = torch.ones(n, dtype=torch.float32, device=env.device)
    recv = torch.empty_like(send)

    def call() -> None:
        if env.group is None:  # one rank: the collective is the identity
            recv.copy_(send)
        else:
            dist.all_to_all_single(recv, send, group=env.group)

    for _ in range(warmup):
        call()
    cuda = env.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(env.device)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    if cuda:
        stop.record()
        torch.cuda.synchronize(env.device)
        return start.elapsed_time(stop) / 1e3 / iters
    return (time.perf_counter() - t0) / iters


def measure(env: DistEnv, sizes_mb: list[float], warmup: int, iters: int) -> list[dict[str, Any]]:
    """One record per size (the same on every rank)."""
    w = env.world_size
    out = []
    for mb in sizes_mb:
        nbytes = max(4 * w, int(mb * 2**20) // (4 * w) * (4 * w))
        secs = max(all_gather_object(env, time_size(env, nbytes, warmup, iters)))
        algbw = nbytes / secs / 1e9
        out.append({
            "bytes_per_rank": nbytes, "time_ms": 1e3 * secs, "algbw_gbs": algbw,
            "busbw_gbs": algbw * (w - 1) / w,
        })  # fmt: skip
    return out


def table(payload: dict[str, Any]) -> str:
    rows = [f"{'MiB/rank':>9} {'ms':>9} {'algbw GB/s':>11} {'busbw GB/s':>11}"]
    for r in payload["results"]:
        rows.append(
            f"{r['bytes_per_rank'] / 2**20:>9.1f} {r['time_ms']:>9.3f} {r['algbw_gbs']:>11.2f} "
            f"{r['busbw_gbs']:>11.2f}"
        )
    return "\n".join(rows)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--sizes-mb", default=DEFAULT_SIZES_MB, help="MiB sent per rank per call")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--timeout", type=float, default=300.0, help="collective timeout, seconds")
    p.add_argument("--out", type=Path, default=None, help="JSON file (rank 0 writes it)")
    a = p.parse_args(argv)
    try:
        a.sizes = [float(x) for x in a.sizes_mb.split(",") if x.strip()]
    except ValueError:
        p.error(f"--sizes-mb: expected comma-separated numbers, got {a.sizes_mb!r}")
    if not a.sizes or min(a.sizes) <= 0:
        p.error(f"--sizes-mb: expected sizes > 0, got {a.sizes_mb!r}")
    if a.warmup < 0 or a.iters < 1:
        p.error("--warmup must be >= 0 and --iters >= 1")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available on this machine (--device cpu: gloo)")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    env = init_distributed(device=a.device, timeout_s=a.timeout)
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)
    try:
        results = measure(env, a.sizes, a.warmup, a.iters)
        if env.rank == 0:
            payload = {
                "machine": machine_info(env.device), "backend": env.backend,
                "world": env.world_size, "warmup": a.warmup, "iters": a.iters,
                "note": "" if env.world_size > 1 else "1 rank: a device-local copy, no link",
                "command": " ".join([Path(sys.executable).name, *sys.argv]),
                "results": results,
            }  # fmt: skip
            print(f"all-to-all, {env.world_size} rank(s), backend {env.backend}")
            print(table(payload), flush=True)
            if a.out is not None:
                a.out.parent.mkdir(parents=True, exist_ok=True)
                a.out.write_text(json.dumps(payload, indent=2))
    finally:
        shutdown(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
