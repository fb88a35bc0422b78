"""Does a new batch size compile the row and batch-plan kernels again? (issue 30: the first
partial batch of an epoch stalled ~5 s on 2 H100s while Triton compiled them for its size.)

Calls each public launcher at n = 8192 x 26 ids, then a partial batch (64558), then 64560,
timing every call (synchronized) and counting the compiled variants in Triton's caches; then
one kernel's steady-state time with and without ``do_not_specialize`` (what unspecialized
sizes cost). ``PYTHONPATH=. python bench/gpu/recompile_check.py`` (``--scale 64``: smaller
sizes, e.g. on CPU with ``TRITON_INTERPRET=1``, where no cache is counted).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from triton.runtime.jit import JITFunction

from hetgmp.embedding import kernels as K
from hetgmp.embedding.kernels.adagrad import adagrad_rows
from hetgmp.embedding.kernels.launcher import _kernels, row_tiles
from hetgmp.embedding.kernels.prep import new_min_map, prepare_triton

SIZES = (8192 * 26, 2483 * 26, 64560)  # full batch, partial batch (not % 16), % 16


def variants() -> int:
    """Compiled variants held by every kernel the launchers use (-1: interpreter)."""
    ks = [v for v in vars(_kernels()).values() if isinstance(v, JITFunction)]
    return sum(len(c[0]) for k in ks for c in k.device_caches.values()) if ks else -1


def launchers(rows: int, d: int, nmax: int, dev: torch.device) -> dict[str, Callable]:
    """Each public launcher as a call over the first ``n`` of one set of distinct ids."""
    table = torch.randn(rows, d, device=dev)
    state = torch.zeros(rows, device=dev)
    pos = torch.zeros(rows, dtype=torch.int32, device=dev)
    flag = torch.zeros(1, dtype=torch.int32, device=dev)
    cnt = torch.zeros(2, dtype=torch.int64, device=dev)
    slot_of = torch.arange(rows, dtype=torch.int32, device=dev)
    block_of = (slot_of % 6).to(torch.int32)  # (2 ranks: 3w = 6 blocks)
    min_map = new_min_map(rows, dev)
    ids = torch.randperm(rows, device=dev)  # distinct rows (Adagrad's precondition)
    g = torch.randn(nmax, d, device=dev)
    tr = {"backend": "triton"}

    def local(n: int) -> object:
        s = K.mark_local(ids[:n], pos, flag, cnt[:1], rows, **tr)
        return K.take_local(table, s, pos, flag, cnt[:1], cnt[1:], **tr)

    return {
        "take_rows": lambda n: K.take_rows(table, ids[:n], **tr),
        "scatter_add_rows": lambda n: K.scatter_add_rows(table, ids[:n], g[:n], 1e-3, **tr),
        "put_rows": lambda n: K.put_rows(table, ids[:n], g[:n], **tr),
        "mark_local+take_local": local,
        "adagrad_rows": lambda n: adagrad_rows(table, state, ids[:n], g[:n], 0.01, 1e-8, **tr),
        "prepare_triton (5)": lambda n: prepare_triton(ids[:n], slot_of, block_of, min_map, 2),
    }


def timed(fn: Callable[[], object], dev: torch.device, reps: int = 1) -> float:
    """Seconds per call of ``fn``, the device synchronized before and after."""
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps


def steady(kernel: JITFunction, grid: tuple, args: tuple, c: dict, dev: torch.device) -> str:
    """``kernel`` warm (ms per launch, 50 launches): as marked, and a copy that specializes on
    every int (``n % 16 == 0`` known: what unspecialized sizes cost)."""
    ms = []
    for k in (kernel, JITFunction(kernel.fn)):
        timed(lambda k=k: k[grid](*args, **c), dev)  # (compile)
        ms.append(1e3 * timed(lambda k=k: k[grid](*args, **c), dev, reps=50))
    return f"{kernel.__name__} warm: {ms[0]:.4f} ms marked, {ms[1]:.4f} ms specialized"


def steady_pair(d: int, n: int, dev: torch.device) -> None:
    k, i32 = _kernels(), {"dtype": torch.int32, "device": dev}
    table, ids = torch.randn(n, d, device=dev), torch.randperm(n, device=dev)
    br, bd = row_tiles(k.triton, d)
    args = (table, ids, torch.empty(n, d, device=dev), n)
    print(steady(k.take, (-(-n // br),), args, {"D": d, "BLOCK_R": br, "BLOCK_D": bd}, dev))
    args = (ids, torch.empty_like(ids), torch.zeros(n, **i32), torch.zeros(1, **i32),
            torch.zeros(1, dtype=torch.int64, device=dev), n, n)  # fmt: skip
    print(steady(k.mark_local, (-(-n // 1024),), args, {"BLOCK": 1024}, dev))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--scale", type=int, default=1, help="divide the sizes (CPU smoke run)")
    a = ap.parse_args()
    sizes = tuple(max(1, s // a.scale) for s in SIZES)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    calls = launchers(max(a.rows // a.scale, max(sizes)), a.dim, max(sizes), dev)
    grew, later = [], 0.0
    print(f"{'launcher':24s}" + "".join(f"{f'n={n} (s)':>16s}" for n in sizes))
    for name, fn in calls.items():
        row = f"{name:24s}"
        for i, n in enumerate(sizes):
            before = variants()
            t = timed(lambda fn=fn, n=n: fn(n), dev)
            new = variants() - before
            later += t if i else 0.0
            grew += [f"{name}@{n}"] if i and new > 0 else []
            row += f"{t:12.4f} +{new if before >= 0 else '?'}v"
        print(row)
    if dev.type == "cuda":  # (the interpreter compiles nothing)
        steady_pair(a.dim, sizes[0], dev)
    verdict = "RECOMPILED for " + ", ".join(grew) if grew else "no recompilation"
    if variants() < 0:
        verdict = "interpreter: compiled variants not counted"
    print(f"recompile_check: {verdict}; the later sizes' first calls took {later:.3f} s in all "
          f"({dev})")  # fmt: skip


if __name__ == "__main__":
    main()
