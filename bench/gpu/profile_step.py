"""Where an embedding step's time goes on the GPU: host (launch) time vs device (kernel) time.

Runs the benchmark's embedding-only step (lookup + exchange + update, fixed gradient) of one
contender under ``torch.profiler`` with CPU and CUDA activities, and prints per step: wall time,
summed kernel time, the share of the wall time the GPU is busy, the number of kernels and host
syncs, the top kernels by device time and the top host ops by self CPU time. A step whose GPU is
busy for a small share of its wall time is bound by the host (launches, syncs), not by HBM or
NVLink. Writes ``profile_<contender>_b<batch>_w<world>.json`` (rank 0; ``..._rank<r>.json`` for the
others) and rank 0's Chrome trace under ``--out``.

    torchrun --standalone --nproc_per_node 2 bench/gpu/profile_step.py \\
        --workload /tmp/hetgmp-gpu-bench/workload_w2 --contender hetgmp-b100 --out /tmp/prof
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench.gpu.harness import embedding_step  # noqa: E402
from hetgmp.comm.collectives import barrier  # noqa: E402
from hetgmp.comm.launch import init_distributed, shutdown  # noqa: E402

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def _summarise(prof: profile, steps: int, wall_ms: float) -> dict:
    kernels: dict[str, list[float]] = {}
    host: dict[str, float] = {}
    syncs = launches = 0
    busy_us = nccl_us = 0.0
    for e in prof.events():
        dev_type = getattr(e, "device_type", None)
        if dev_type is not None and dev_type.name == "CUDA":
            kernels.setdefault(e.name, []).append(e.device_time_total)
            busy_us += e.device_time_total
            if "nccl" in e.name.lower():  # includes time spent waiting for the peer
                nccl_us += e.device_time_total
            continue
        if e.name in SYNC_CALLS:
            syncs += 1
        if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"):
            launches += 1
        host[e.name] = host.get(e.name, 0.0) + e.self_cpu_time_total
    top_k = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:15]
    top_h = sorted(host.items(), key=lambda kv: -kv[1])[:20]
    return {
        "wall_ms_per_step": wall_ms,
        "kernel_ms_per_step": busy_us / 1e3 / steps,
        "nccl_kernel_ms_per_step": nccl_us / 1e3 / steps,
        "gpu_busy_share": busy_us / 1e3 / steps / wall_ms if wall_ms else None,
        "kernels_per_step": sum(len(v) for v in kernels.values()) / steps,
        "launches_per_step": launches / steps,
        "host_syncs_per_step": syncs / steps,
        "top_kernels_ms_per_step": [[k, sum(v) / 1e3 / steps, len(v) / steps] for k, v in top_k],
        "top_host_self_ms_per_step": [[k, v / 1e3 / steps] for k, v in top_h],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--contender", default="hetgmp-b100")
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument(
        "--warmup",
        type=int,
        default=40,
        help="steps before profiling (capacities and CUDA graphs settle)",
    )
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: smoke test")
    a = ap.parse_args()
    env = init_distributed(device=a.device)
    try:
        # (the harness's embedding step: the next batch's ids prefetched, a fixed gradient)
        cont, step = embedding_step(env, a.workload, a.contender, batch=a.batch, dim=a.dim)
        dev = env.device

        cuda = dev.type == "cuda"
        sync = torch.cuda.synchronize if cuda else (lambda _d: None)
        for k in range(a.warmup):
            step(k)
        sync(dev)
        barrier(env)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            t0 = time.perf_counter()
            for k in range(a.warmup, a.warmup + a.steps):
                step(k)
            sync(dev)
            wall_ms = (time.perf_counter() - t0) * 1e3 / a.steps
        summary = _summarise(prof, a.steps, wall_ms)
        summary.update(
            contender=a.contender, batch=a.batch, dim=a.dim, world=env.world_size, rank=env.rank,
            gpu=torch.cuda.get_device_name(dev) if cuda else "cpu", torch=torch.__version__,
        )  # fmt: skip
        # every rank's summary (a rank that waits in NCCL for a slower peer shows it), rank 0's
        # trace; rank r > 0 writes ..._rank<r>.json
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = f"profile_{a.contender}_b{a.batch}_w{env.world_size}"
        suffix = "" if env.rank == 0 else f"_rank{env.rank}"
        (out / f"{stem}{suffix}.json").write_text(json.dumps(summary, indent=1))
        if env.rank == 0:
            prof.export_chrome_trace(str(out / f"{stem}.trace.json"))
            print(json.dumps(summary, indent=1), flush=True)
        barrier(env)
    finally:
        shutdown(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
