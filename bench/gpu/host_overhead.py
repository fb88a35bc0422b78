"""Host (Python / dispatch / launch) cost of one embedding step, isolated from device compute.

The GPU benchmark's embedding-only step (``bench/gpu/harness.py``, mode ``embedding``) on one
rank is bound by the host on an H200: its kernels take ~0.17 ms, its Python and launches ~0.5
ms. This script runs that exact step,

    out = cont(ids); cont.prefetch(next ids); out.backward(grad); cont.after_backward()

(ids picked per step with the harness's ``batch_positions`` + ``index_select``, its fixed
gradient, a disabled phase timer) many times and reports microseconds per step, so changes to the
host path can be measured anywhere:

* on CPU with tiny sizes (default: batch 8 x 26 fields, dim 4, 1000 rows), where the compute is
  negligible and the time per step is the host path (torch backend kernels);
* on CUDA with the real sizes (``--device cuda --batch 8192 --dim 128 --rows 1000000``), where
  it reports both the host time of the calls (no sync inside a round) and the wall time per
  step with a sync at the end of each round, plus (``--launch``) the host time of one Triton
  launch through ``kernel[grid](...)`` vs :mod:`hetgmp.embedding.kernels`' cached launcher.

``--ref GITREF`` compares against another commit in the same run: the ref's ``hetgmp`` and
``bench`` are exported (``git archive``) to a temporary directory and both versions run as
alternating subprocesses of this script (``--rounds`` each time), so machine noise hits both;
ratios are of the medians. ``--profile N`` prints a cProfile breakdown of N steps (tottime per
step, which cProfile inflates: use it for shares, the timed rounds for totals).

    PYTHONPATH=. python bench/gpu/host_overhead.py                        # CPU, tiny sizes
    PYTHONPATH=. python bench/gpu/host_overhead.py --ref HEAD~3 --profile 2000
    PYTHONPATH=. python bench/gpu/host_overhead.py --device cuda --batch 8192 --dim 128 \\
        --rows 1000000 --launch --ref main                                # on a GPU

Timings are printed, never asserted (tests do not time anything).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__" and "HOST_OVERHEAD_KEEP_PATH" not in os.environ:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def _build(name: str, args: argparse.Namespace, dev: torch.device) -> Any:
    import numpy as np

    from bench.gpu import contenders as C
    from hetgmp.comm.env import DistEnv

    cards = np.array([args.rows], dtype=np.int64)  # one table: the fields share it
    return C.build(name, cards=cards, dim=args.dim, env=DistEnv.single(dev), lr=0.01, seed=0)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure(names: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rounds of ``args.steps`` steps of every contender in ``names``, the contenders taking
    turns round by round (so that load from other processes hits them alike): per-round host
    and wall us/step, medians and minima; then (``args.profile``) a cProfile of each."""
    from bench.gpu.harness import embedding_step_fn, fixed_grad

    dev = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    ids_all = torch.randint(args.rows, (args.samples, args.fields), generator=g).to(dev)
    grad = fixed_grad(args.batch, args.fields, args.dim, 0, 0, dev)
    steps = [
        embedding_step_fn(_build(name, args, dev), ids_all, grad, args.batch) for name in names
    ]
    k = [0] * len(names)
    for i, step in enumerate(steps):
        for _ in range(args.warmup):
            step(k[i])
            k[i] += 1
    _sync(dev)
    host, wall = _timed_rounds(steps, k, args, dev)
    recs = []
    for i, name in enumerate(names):
        rec: dict[str, Any] = {
            "contender": name,
            "host_us": statistics.median(host[i]),
            "host_us_min": min(host[i]),
            "wall_us": statistics.median(wall[i]),
            "wall_us_min": min(wall[i]),
        }
        if args.profile:
            rows = _profile_rows(steps[i], k, i, args, dev)
            rec["profile"] = rows[: args.top]
            rec["profile_total_us"] = sum(r[2] for r in rows)
        recs.append(rec)
    return recs


def _timed_rounds(
    steps: list[Any], k: list[int], args: argparse.Namespace, dev: torch.device
) -> tuple[list[list[float]], list[list[float]]]:
    """Per contender, per round: host us/step (no sync inside the round) and wall us/step
    (synced at its end). ``k`` (each contender's next step) is advanced in place."""
    host: list[list[float]] = [[] for _ in steps]
    wall: list[list[float]] = [[] for _ in steps]
    for _ in range(args.rounds):
        for i, step in enumerate(steps):
            gc.collect()
            _sync(dev)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(k[i])
                k[i] += 1
            t1 = time.perf_counter()
            _sync(dev)
            t2 = time.perf_counter()
            host[i].append(1e6 * (t1 - t0) / args.steps)
            wall[i].append(1e6 * (t2 - t0) / args.steps)
    return host, wall


def _profile_rows(
    step: Any, k: list[int], i: int, args: argparse.Namespace, dev: torch.device
) -> list[tuple[str, float, float, float]]:
    """cProfile of ``args.profile`` steps of contender ``i``: ``(where, calls, tottime us,
    cumtime us)`` per step and function, by descending tottime."""
    prof = cProfile.Profile()
    _sync(dev)
    prof.enable()
    for _ in range(args.profile):
        step(k[i])
        k[i] += 1
    _sync(dev)
    prof.disable()
    st = pstats.Stats(prof)
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(file).name}:{line}({func})" if line else func
        p = args.profile
        rows.append((where, nc / p, 1e6 * tt / p, 1e6 * ct / p))
    rows.sort(key=lambda r: -r[2])
    return rows


def launch_costs(args: argparse.Namespace) -> dict[str, float]:
    """CUDA: host us per launch of the row-gather kernel through ``kernel[grid](...)`` and
    through the cached launcher (when this version of hetgmp has one)."""
    from hetgmp.embedding.kernels import launcher as K

    dev = torch.device(args.device)
    table = torch.randn(args.rows, args.dim, device=dev)
    idx = torch.randint(args.rows, (args.batch * args.fields,), device=dev)
    out = torch.empty(idx.numel(), args.dim, device=dev)
    k = K._kernels()
    block_r, block_d = K._row_tiles(k.triton, args.dim)
    n = idx.numel()
    grid = (k.triton.cdiv(n, block_r),)
    res: dict[str, float] = {}

    def plain() -> None:
        k.take[grid](table, idx, out, n, D=args.dim, BLOCK_R=block_r, BLOCK_D=block_d)

    variants = {"triton_jit_run": plain}
    if hasattr(K, "launch"):

        def fast() -> None:
            K.launch(k.take, grid, (table, idx, out, n), {"D": args.dim, "BLOCK_R": block_r,
                                                          "BLOCK_D": block_d})  # fmt: skip

        variants["cached_launcher"] = fast
    for label, fn in variants.items():
        for _ in range(20):
            fn()
        _sync(dev)
        best = float("inf")
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for _ in range(200):
                fn()
            best = min(best, 1e6 * (time.perf_counter() - t0) / 200)
            _sync(dev)
        res[label] = best
    return res


def worker(args: argparse.Namespace) -> dict[str, Any]:
    if args.device == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    out: dict[str, Any] = {"results": measure(args.contenders, args)}
    if args.launch and args.device == "cuda":
        out["launch_us"] = launch_costs(args)
    return out


def _export(ref: str, dest: Path) -> None:
    """``hetgmp`` and ``bench`` of git ``ref`` into ``dest`` (plus this checkout's native
    extension, which git does not track)."""
    arch = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "hetgmp", "bench"], check=True,
        capture_output=True,
    ).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch, check=True)
    for so in (ROOT / "hetgmp").glob("_native*.so"):
        shutil.copy2(so, dest / "hetgmp" / so.name)


def _run_worker(path: Path, argv: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(path), HOST_OVERHEAD_KEEP_PATH="1")
    p = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *argv, "--worker"], env=env,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if p.returncode:
        raise RuntimeError(f"worker for {path} failed:\n{p.stdout}\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _print_profile(rec: dict[str, Any]) -> None:
    print(f"  cProfile, {rec['contender']}: {rec['profile_total_us']:.1f} us/step under cProfile")
    print(f"    {'tottime us/step':>15} {'calls/step':>10}  function")
    for where, calls, tt, _ct in rec["profile"]:
        print(f"    {tt:15.2f} {calls:10.2f}  {where}")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--fields", type=int, default=26)
    ap.add_argument("--dim", type=int, default=4)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=0, help="ids pool (default: 4 batches)")
    ap.add_argument("--contenders", default="torch,hetgmp")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--steps", type=int, default=500, help="steps per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=2, help="--ref: alternating runs per side")
    ap.add_argument("--threads", type=int, default=1, help="CPU: torch threads (0: leave)")
    ap.add_argument("--profile", type=int, default=0, help="cProfile this many extra steps")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--launch", action="store_true", help="CUDA: host us per Triton launch")
    ap.add_argument("--ref", default=None, help="git ref to compare against (old vs new)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.contenders = [c for c in args.contenders.split(",") if c]
    args.samples = args.samples or 4 * args.batch
    return args


def _worker_argv(argv: list[str] | None) -> list[str]:
    """The command line without ``--ref``: the workers measure one version each."""
    passed = [a for a in (argv if argv is not None else sys.argv[1:])]
    if "--ref" in passed:
        i = passed.index("--ref")
        passed = passed[:i] + passed[i + 2 :]
    return [a for a in passed if not a.startswith("--ref=")]


def _run_sides(args: argparse.Namespace, passed: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every worker's output per side (``new``: this checkout; ``old``: ``--ref``), the sides
    alternating ``--repeats`` times."""
    runs: dict[str, list[dict[str, Any]]] = {"new": []}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"new": ROOT}
        if args.ref:
            _export(args.ref, Path(tmp))
            paths["old"] = Path(tmp)
            runs["old"] = []
        for rep in range(args.repeats if args.ref else 1):
            for side, path in paths.items():
                # (the profile is taken once per side)
                argv_side = passed if rep == 0 else [*passed, "--profile", "0"]
                runs[side].append(_run_worker(path, argv_side))
    return runs


def _print_side(
    args: argparse.Namespace, side: str, got: list[dict[str, Any]], summary: dict[str, Any]
) -> None:
    """One side's medians over its workers (added to ``summary``), launch costs, profiles."""
    label = "this checkout" if side == "new" else f"ref {args.ref}"
    print(f"-- {side} ({label})")
    for i, name in enumerate(args.contenders):
        host = statistics.median(r["results"][i]["host_us"] for r in got)
        wall = statistics.median(r["results"][i]["wall_us"] for r in got)
        best = min(r["results"][i]["wall_us_min"] for r in got)  # (least disturbed)
        summary[f"{side}/{name}"] = {"host_us": host, "wall_us": wall, "wall_us_min": best}
        print(
            f"  {name:<10} host {host:9.1f} us/step   wall {wall:9.1f} us/step   "
            f"(best round {best:.1f})"
        )
    if "launch_us" in got[0]:
        for label2, us in got[0]["launch_us"].items():
            print(f"  launch {label2:<16} {us:7.1f} us (host, per launch)")
        summary[f"{side}/launch_us"] = got[0]["launch_us"]
    for rec in got[0]["results"]:
        if "profile" in rec:
            _print_profile(rec)


def _print_ratios(args: argparse.Namespace, sides: list[str], summary: dict[str, Any]) -> None:
    """Speed vs torch per side, and new vs ``--ref`` per contender (ratios of the medians)."""
    if "torch" in args.contenders:
        for side in sides:
            for name in args.contenders:
                if name != "torch":
                    a, b = summary[f"{side}/torch"], summary[f"{side}/{name}"]
                    r, rb = a["wall_us"] / b["wall_us"], a["wall_us_min"] / b["wall_us_min"]
                    print(
                        f"  {side}: {name} speed vs torch (wall) {r:.2f}x (best rounds {rb:.2f}x)"
                    )
    if args.ref:
        for name in args.contenders:
            a, b = summary[f"old/{name}"], summary[f"new/{name}"]
            r, rb = a["wall_us"] / b["wall_us"], a["wall_us_min"] / b["wall_us_min"]
            print(f"  {name}: new is {r:.2f}x faster than {args.ref} (wall; best rounds {rb:.2f}x)")


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    sizes = f"batch {args.batch} x {args.fields} fields, dim {args.dim}, {args.rows} rows"
    print(f"[host_overhead] {args.device}, {sizes}, {args.rounds} rounds x {args.steps} steps")
    runs = _run_sides(args, _worker_argv(argv))
    summary: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "worker"}}
    for side, got in runs.items():
        _print_side(args, side, got, summary)
    _print_ratios(args, list(runs), summary)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
