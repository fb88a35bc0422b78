"""Diagnosis (not a product figure): how long an async read waits for a busy peer's GIL.

Under ``--sync async`` each rank's row service is a thread in the rank's interpreter, so it
answers a peer only when it gets the GIL from the rank's training thread. This harness runs 2
gloo CPU ranks with an async table (``--max-lag -1``): rank 0 trains ``--steps`` steps of a
64 x 26 batch, reading rank 1's rows, while rank 1's training thread

* ``sleep``s (its service has the interpreter to itself),
* runs ``short`` torch calls in a loop (each drops the GIL for a moment, as a CUDA training
  thread launching kernels does), or
* runs ``python`` (a pure-Python loop that keeps the GIL until the interpreter forces a switch).

It prints rank 0's mean ms per read for each, for each pair ``SERVING:ANSWERING`` of switch
intervals of :mod:`hetgmp.comm.rpc.service` (while a service runs, while it
answers; ``0:0`` leaves CPython's 5 ms) in ``--intervals``, and writes
``bench/results/async_gil.md``.

Usage: ``python bench/async_gil.py [--intervals 0:0 1e-4:1e-4 1e-4:5e-6] [--steps 200]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from hetgmp.comm.collectives import barrier  # noqa: E402
from hetgmp.comm.env import DistEnv  # noqa: E402
from hetgmp.comm.spawn import spawn_ranks  # noqa: E402
from hetgmp.embedding import DistributedEmbedding  # noqa: E402
from hetgmp.embedding.rowservice import AsyncConfig  # noqa: E402

BUSY = ("sleep", "short", "python")


def _keep_busy(env: DistEnv, busy: str) -> None:
    """Rank 1: be ``busy`` until rank 0 has finished (a barrier on another thread)."""
    done = threading.Event()
    threading.Thread(target=lambda: (barrier(env), done.set()), daemon=True).start()
    x = torch.zeros(8)
    while not done.wait(0.05 if busy == "sleep" else 0):
        for _ in range(100):
            if busy == "short":
                x.add_(1.0)
            elif busy == "python":
                sum(range(100))


def _rank(env: DistEnv, busy: str, steps: int, switch: tuple[float, float]) -> dict[str, Any]:
    import hetgmp.comm.rpc.service as svc

    svc.SWITCH_INTERVAL_S, svc.ANSWER_SWITCH_INTERVAL_S = switch
    torch.set_num_threads(1)
    emb = DistributedEmbedding(
        100_000, 16, env, optimizer="adagrad", lr=0.05, sync="async", bound=100,
        async_config=AsyncConfig(max_lag=-1, host="127.0.0.1", timeout_s=120),
    )  # fmt: skip
    ids = torch.from_numpy(np.random.default_rng(env.rank).integers(0, 100_000, size=(64, 26)))
    emb(ids).sum().backward()
    barrier(env)
    out: dict[str, Any] = {}
    if env.rank == 0:
        read0 = emb.async_engine.phase_s["read"]
        t0 = time.perf_counter()
        for _ in range(steps):
            emb(ids).sum().backward()
        out["step_ms"] = (time.perf_counter() - t0) / steps * 1000
        out["read_ms"] = (emb.async_engine.phase_s["read"] - read0) / steps * 1000
        barrier(env)
    else:
        _keep_busy(env, busy)
    emb.flush()
    emb.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--intervals", nargs="+", default=["0:0", "1e-4:1e-4", "1e-4:5e-6"])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--out", default="async_gil", help="results name under bench/results/")
    a = p.parse_args()
    rows = []
    for text in a.intervals:
        switch = tuple(float(x) for x in text.split(":"))
        for busy in BUSY:
            r = spawn_ranks(
                _rank, 2, busy, a.steps, switch, timeout_s=1200, collective_timeout_s=1200
            )[0]
            rows.append((text, busy, r["read_ms"], r["step_ms"]))
            print(f"{text} peer {busy}: read {r['read_ms']:.2f} ms", flush=True)
    lines = [
        "# Async read vs a busy peer's GIL (diagnosis, 2 gloo CPU ranks)",
        "",
        f"- machine: `{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)`",
        f"- command: `python {' '.join(sys.argv)}`",
        f"- date: `{dt.datetime.now().isoformat(timespec='seconds')}`",
        "",
        "| switch interval s (serving:answering) | peer's training thread | read ms | step ms |",
        "|---|---|---|---|",
        *(f"| {t} | {b} | {r:.2f} | {s:.2f} |" for t, b, r, s in rows),
        "",
    ]
    out = ROOT / "bench" / "results" / f"{a.out}.md"
    out.write_text("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
