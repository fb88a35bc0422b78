"""Diagnosis (not a product figure): what a service thread's answers cost the training thread
of the same interpreter, the GIL convoy behind ``hetgmp.embedding.rowservice.answer``.

Every torch call made from Python drops the GIL for its C++ work and takes it back; two
threads that both make torch calls therefore alternate at every call, each hand-over a thread
wake-up. Here a "training" thread makes small torch calls (as a CUDA rank's training thread
launches kernels) while a "service" thread answers a read of ``--rows`` rows every
``--every-us`` microseconds, either with the read's arithmetic run as Python (~20 torch calls,
:func:`answer._read_answer`) or scripted (one call, no GIL:
:data:`answer.read_answer`). Printed and written to ``bench/results/async_convoy.md``:
the training thread's calls per second, relative to no service at all, and the mean time of an
answer, best of ``--rounds``.

Usage: ``python bench/async_convoy.py [--device cpu|cuda] [--seconds 1] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from hetgmp.embedding.rowservice import answer as aa  # noqa: E402


def _args(rows: int, device: str) -> tuple[Any, ...]:
    """A read of ``rows`` owned rows (half as mirror queries) of a 100k x 16 Adagrad table."""
    n, dev = 100_000, torch.device(device)
    own_slot = torch.cat([torch.tensor([-1]), torch.arange(n), torch.tensor([-1])]).int().to(dev)
    weight, version = torch.randn(n, 16, device=dev), torch.zeros(n, dtype=torch.int64, device=dev)
    state = torch.zeros(n, device=dev)
    ids = torch.randint(0, n, (rows,), device=dev)
    half = rows // 2
    ids = ids.cpu()  # (requests arrive on the host)
    return (own_slot.cpu(), n, weight, version, state, True, ids[:half],
            torch.zeros(half, dtype=torch.int64), ids[half:], 0, True)  # fmt: skip


def _measure(
    seconds: float, answer: Callable[..., Any] | None, args: tuple[Any, ...], every_s: float,
    device: str,
) -> tuple[float, float]:  # fmt: skip
    """(training calls per second, mean seconds per answer) with ``answer`` served meanwhile."""
    stop, times = threading.Event(), []

    def serve() -> None:
        stream = torch.cuda.Stream() if device == "cuda" else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            while not stop.is_set():
                t0 = time.perf_counter()
                answer(*args)  # type: ignore[misc]
                times.append(time.perf_counter() - t0)
                time.sleep(every_s)  # (waiting for the next request: the GIL is free)

    th = threading.Thread(target=serve) if answer is not None else None
    if th is not None:
        th.start()
    x, n, t0 = torch.ones(8, device=device), 0, time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            for _ in range(100):
                x = x + 1
            n += 100
        rate = n / (time.perf_counter() - t0)
    finally:
        stop.set()
        if th is not None:
            th.join()
    return rate, (sum(times) / len(times) if times else 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--every-us", type=float, default=500.0)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="async_convoy", help="results name under bench/results/")
    a = p.parse_args()
    torch.set_num_threads(1)
    args = _args(a.rows, a.device)
    aa.read_answer(*args)  # (compiled at the first call)
    kinds = {"no service": None, "python answers": aa._read_answer, "scripted": aa.read_answer}
    best: dict[str, tuple[float, float]] = {}
    for _ in range(a.rounds):  # (interleaved: drift shows in every kind alike)
        for name, fn in kinds.items():
            rate, ans = _measure(a.seconds, fn, args, a.every_us * 1e-6, a.device)
            if rate > best.get(name, (0.0, 0.0))[0]:
                best[name] = (rate, ans)
    base = best["no service"][0]
    lines = [
        "# The GIL convoy: training-thread torch calls next to a service thread's answers",
        "",
        f"- machine: `{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)`"
        + (f", `{torch.cuda.get_device_name()}`" if a.device == "cuda" else ""),
        f"- command: `python {' '.join(sys.argv)}`",
        f"- date: `{dt.datetime.now().isoformat(timespec='seconds')}`, torch `{torch.__version__}`",
        f"- a read of {a.rows} rows every {a.every_us:g} us, best of {a.rounds} rounds of "
        f"{a.seconds:g} s",
        "",
        "| service | training calls/s | vs no service | ms per answer |",
        "|---|---|---|---|",
    ]
    for name, (rate, ans) in best.items():
        lines.append(f"| {name} | {rate:.0f} | {rate / base:.2f} | {1e3 * ans:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "bench" / "results" / f"{a.out}.md"
    out.write_text(text)


if __name__ == "__main__":
    main()
