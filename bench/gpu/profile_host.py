"""Where an embedding step's HOST time goes, per Python function, on any number of ranks.

``profile_step.py`` (torch.profiler) shows kernels and ATen ops, but inflates host times and
skews ranks against each other; this runs the benchmark's embedding-only step (the harness's
``out = cont(ids); cont.prefetch(next); out.backward(grad)``) of one contender on every rank:
first ``--steps`` steps timed plainly (wall per step, synchronised at the end: the reference
figure), then ``--profile`` steps under ``cProfile`` on every rank, and prints rank 0's top
functions by self time per step (cProfile inflates each call by roughly a microsecond: read
shares, not totals). Every rank writes ``host_<contender>_b<batch>_w<world>_rank<r>.txt``.

    torchrun --standalone --nproc_per_node 2 bench/gpu/profile_host.py \\
        --workload /tmp/hetgmp-gpu-bench/workload_w2 --contender hetgmp-b100-pad --out /tmp/ph
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.gpu.harness import embedding_step  # noqa: E402
from hetgmp.comm.collectives import barrier  # noqa: E402
from hetgmp.comm.env import DistEnv  # noqa: E402
from hetgmp.comm.launch import init_distributed, shutdown  # noqa: E402


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--contender", default="hetgmp-b100-pad")
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--steps", type=int, default=200, help="timed steps (no profiler)")
    ap.add_argument("--profile", type=int, default=200, help="steps under cProfile")
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    return ap.parse_args()


def _time_and_profile(
    step: Callable[[int], None], a: argparse.Namespace, env: DistEnv
) -> tuple[float, float, cProfile.Profile]:
    """Warm-up, then us/step of ``a.steps`` plain steps and of ``a.profile`` steps under
    cProfile (all ranks in step at each start), and that profile."""
    dev = env.device

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    k = 0
    for _ in range(a.warmup):
        step(k)
        k += 1
    sync()
    barrier(env)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step(k)
        k += 1
    sync()
    wall_us = 1e6 * (time.perf_counter() - t0) / a.steps
    barrier(env)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(a.profile):
        step(k)
        k += 1
    sync()
    prof.disable()
    prof_us = 1e6 * (time.perf_counter() - t0) / a.profile
    return wall_us, prof_us, prof


def _profile_text(
    a: argparse.Namespace, env: DistEnv, wall_us: float, prof_us: float, prof: cProfile.Profile
) -> str:
    """The rank's report: both timings, then the top functions by self time per step."""
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[: a.top]  # type: ignore[attr-defined]
    lines = [
        f"[profile_host] {a.contender} batch {a.batch} world {env.world_size} rank {env.rank}: "
        f"{wall_us:.1f} us/step plain, {prof_us:.1f} us/step under cProfile",
        "  self us/step  calls/step  cumulative us/step  function",
    ]
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in rows:
        where = f"{Path(file).name}:{line}({fn})" if line else fn
        lines.append(
            f"  {1e6 * tt / a.profile:11.1f}  {nc / a.profile:10.2f}  "
            f"{1e6 * ct / a.profile:18.1f}  {where}"
        )
    return "\n".join(lines)


def main() -> int:
    a = _parse_args()
    env = init_distributed(device=a.device)
    try:
        _cont, step = embedding_step(
            env, a.workload, a.contender, batch=a.batch, dim=a.dim
        )  # (the harness's embedding step)
        text = _profile_text(a, env, *_time_and_profile(step, a, env))
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        name = f"host_{a.contender}_b{a.batch}_w{env.world_size}_rank{env.rank}.txt"
        (out / name).write_text(text + "\n")
        if env.rank == 0:
            print(text, flush=True)
        barrier(env)
    finally:
        shutdown(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
