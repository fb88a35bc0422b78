"""Stragglers: ``--sync collective`` (lockstep) against ``--sync async`` on CPU ranks (issue 17).

One rank is slowed by ``--straggle RANK:FACTOR`` (it waits ``FACTOR - 1`` times its own step
time after each step) for FACTOR in 1 (none), 1.5, 2 and 4. For each mode and factor the same
training (WDL, one epoch of the training split in samples) runs on spawned gloo CPU ranks; the
global samples/s and the test AUC are recorded. The throughput ratio is samples/s with the
straggler over samples/s without it, per mode; the AUC delta is against the lockstep run
without straggler (``--bound 0``). Ideal ratios: lockstep ``1 / FACTOR`` (every rank waits for
the straggler), async ``(W - 1 + 1 / FACTOR) / W`` (only the straggler slows down). Modes
(``--modes``): ``collective``, ``async`` (with work stealing, the default) and ``async-own``
(``--no-work-stealing``: each rank cycles its own shard).

Data: the generated Criteo-like set (made once under ``--work``) and MovieLens 100K, converted
from ``../shared/datasets`` into ``--work`` (never into the repository).

The defaults train at the CLI's default batch (1024 per rank). Each async row also records
every rank's mean ms per step by phase (``phase_ms``: the exchanges and the rest).

Writes ``bench/results/<--out>.json``, ``.md`` and ``.png`` (machine, command, date); ``vs
lockstep 1x`` is samples/s over lockstep's without straggler.

``--device cuda`` runs the user's command instead: ``torchrun --nproc_per_node RANKS
examples/hetuctr.py`` with its default model and flags (one GPU per rank, NCCL for lockstep),
reading each run's ``--output`` JSON.

Usage: ``python bench/bench_async.py [--ranks 4] [--factors 1 1.5 2 4] [--samples 500000]``;
on a 2-GPU machine ``python bench/bench_async.py --device cuda --ranks 2 --out async_2gpu``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetgmp.comm.env import DistEnv  # noqa: E402
from hetgmp.comm.spawn import spawn_ranks  # noqa: E402
from hetgmp.config import validate  # noqa: E402
from hetgmp.train.config import TrainConfig  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MODES = ("collective", "async", "async-own")  # async: with work stealing; -own: without


def _train_rank(env: DistEnv, cfg: TrainConfig) -> dict[str, Any]:
    from hetgmp.train.run import train

    return train(cfg, env)


def datasets(a: argparse.Namespace) -> dict[str, Path]:
    """The generated set (made once) and MovieLens 100K (converted once), under ``--work``."""
    from hetgmp.data.generate import generate_criteo_like
    from hetgmp.data.movielens import convert_movielens

    out = {}
    gen = a.work / f"criteo-like-{a.samples}"
    if not (gen / "meta.json").exists():
        generate_criteo_like(gen, num_samples=a.samples, seed=0, progress=False, overwrite=True)
    out["generated"] = gen
    src = a.shared / "movielens-100k"
    if src.is_dir():
        ml = a.work / "movielens-100k"
        if not (ml / "meta.json").exists():
            convert_movielens(src, ml, overwrite=True)
        out["movielens-100k"] = ml
    else:
        print(f"{src} not found: movielens-100k skipped", flush=True)
    return out


def config(a: argparse.Namespace, data: Path, mode: str, factor: float) -> TrainConfig:
    extra: dict[str, Any] = {}
    if mode.startswith("async"):
        extra = dict(
            sync="async", bound=a.bound, max_lag=a.max_lag, async_host="127.0.0.1",
            dense_sync_every=a.dense_sync_every, work_stealing=mode == "async",
        )  # fmt: skip
    straggle = f"{a.ranks - 1}:{factor:g}:{a.wait}" if factor > 1 else ""
    return validate(TrainConfig(
        dataset=str(data), model="wdl", batch_size=a.batch, embed_dim=8, epochs=1,
        log_every=10_000, progress=False, device="cpu", threads=1, warmup_steps=0,
        straggle=straggle, timeout_s=120.0, seed=0, **extra,
    ))  # fmt: skip


def cli_args(a: argparse.Namespace, data: Path, mode: str, factor: float) -> list[str]:
    """The user's command line for one run on GPUs (the CLI's defaults otherwise)."""
    args = ["--dataset", str(data), "--epochs", "1", "--batch_size", str(a.batch),
            "--device", a.device, "--backend", a.backend, "--seed", "0", "--no-progress",
            "--log_every", "100000",
            "--timeout", "120"]  # fmt: skip
    if mode.startswith("async"):
        args += ["--sync", "async", "--bound", str(a.bound), "--max-lag", str(a.max_lag),
                 "--async-host", "127.0.0.1", "--dense-sync-every", str(a.dense_sync_every),
                 "--work-stealing" if mode == "async" else "--no-work-stealing"]  # fmt: skip
    if factor > 1:
        args += ["--straggle", f"{a.ranks - 1}:{factor:g}:{a.wait}"]
    return args


def run_torchrun(a: argparse.Namespace, data: Path, mode: str, f: float) -> dict[str, Any]:
    """One run of ``torchrun ... examples/hetuctr.py``; its ``--output`` results."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={a.ranks}", str(a.tree / "examples" / "hetuctr.py"),
               *cli_args(a, data, mode, f), "--output", str(out)]  # fmt: skip
        path = os.pathsep.join(x for x in (str(a.tree), os.environ.get("PYTHONPATH", "")) if x)
        env = dict(os.environ, PYTHONPATH=path)  # (the ranks import --tree's hetgmp)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        if proc.returncode != 0:
            log = a.work / f"failed-{mode}-{f:g}.log"  # (the whole output: the cause is early)
            log.write_text(f"{' '.join(cmd)}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
            errors = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()][:20]
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({proc.returncode}); whole output in {log}:\n"
                + "\n".join(errors)
            )
        return json.loads(out.read_text())


def run_one(a: argparse.Namespace, name: str, data: Path, mode: str, f: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    if a.device == "cpu":
        res = spawn_ranks(_train_rank, a.ranks, config(a, data, mode, f), timeout_s=900)[0]
    else:
        res = run_torchrun(a, data, mode, f)
    row = {
        "dataset": name, "mode": mode, "factor": f, "speed": res["speed"],
        "auc": res.get("val_auc"), "samples": res["samples_seen"],
        "train_seconds": res["train_seconds"], "wall_s": time.perf_counter() - t0,
        "steps_per_rank": res.get("async", {}).get("steps_per_rank", [res["step"]] * a.ranks),
        "stolen": sum(res.get("async", {}).get("stolen_per_rank") or [0]),
        "phase_ms": res.get("async", {}).get("phase_ms_per_step"),
    }  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def add_ratios(rows: list[dict[str, Any]], ranks: int) -> None:
    """Throughput ratio (vs the same mode without straggler), ideal ratio, AUC delta (vs
    lockstep without straggler; None where --modes has no collective run)."""
    for r in rows:
        same = [q for q in rows if q["dataset"] == r["dataset"]]
        base = next(q for q in same if q["mode"] == r["mode"] and q["factor"] == 1)
        ref = next((q for q in same if q["mode"] == "collective" and q["factor"] == 1), None)
        r["ratio"] = r["speed"] / base["speed"]
        # (against lockstep without straggler)
        r["vs_lockstep"] = r["speed"] / ref["speed"] if ref else None
        f = r["factor"]
        r["ideal"] = 1 / f if r["mode"] == "collective" else (ranks - 1 + 1 / f) / ranks
        r["auc_delta"] = r["auc"] - ref["auc"] if ref else None


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    from hetgmp.experiments.plots import pyplot

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for name in sorted({r["dataset"] for r in rows}):
        for mode, mark in zip(MODES, ("o", "s", "^"), strict=True):
            rs = sorted((r for r in rows if r["dataset"] == name and r["mode"] == mode),
                        key=lambda r: r["factor"])  # fmt: skip
            fs = [r["factor"] for r in rs]
            ax1.plot(fs, [r["ratio"] for r in rs], marker=mark, label=f"{mode} ({name})")
            ax2.plot(fs, [r["auc"] for r in rs], marker=mark, label=f"{mode} ({name})")
    for mode, style in zip(MODES[:2], (":", "--"), strict=True):
        ideal = sorted({(r["factor"], r["ideal"]) for r in rows if r["mode"] == mode})
        if not ideal:
            continue
        ax1.plot(*zip(*ideal, strict=True), style, color="grey", label=f"ideal {mode}")
    ax1.set(xlabel="straggler factor", ylabel="samples/s ÷ no-straggler samples/s",
            title="throughput kept", ylim=(0, 1.2))  # fmt: skip
    ax2.set(xlabel="straggler factor", ylabel="test AUC", title="AUC")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(a: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    meta = {
        "machine": f"{platform.node()} ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores)",
        "command": "python " + " ".join(sys.argv),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "ranks": a.ranks, "batch": a.batch, "bound": a.bound, "max_lag": a.max_lag,
        "straggler_wait": a.wait, "dense_sync_every": a.dense_sync_every, "device": a.device,
        "backend": a.backend, "tree": str(a.tree),
    }  # fmt: skip
    if a.device == "cuda":
        import torch

        meta["gpus"] = ", ".join(torch.cuda.get_device_name(i)
                                 for i in range(torch.cuda.device_count()))  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{a.out}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    plot(rows, RESULTS / f"{a.out}.png")
    lines = [
        f"# Stragglers: lockstep (--sync collective) vs --sync async, {a.device.upper()} ranks",
        "",
        *(f"- {k}: `{v}`" for k, v in meta.items()),
        "",
        "| data | mode | straggler | samples/s | kept | ideal | vs lockstep 1x | AUC "
        "| AUC - bound 0 | steps/rank | stolen |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['mode']} | {r['factor']:g}x | {r['speed']:.0f} | "
            f"{r['ratio']:.2f} | {r['ideal']:.2f} | {_fmt(r['vs_lockstep'], '.2f')} | "
            f"{r['auc']:.4f} | {_fmt(r['auc_delta'], '+.4f')} | "
            f"{'/'.join(map(str, r['steps_per_rank']))} | {r.get('stolen', 0)} |"
        )
    lines += ["", f"![throughput and AUC]({a.out}.png)", ""]
    (RESULTS / f"{a.out}.md").write_text("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--factors", type=float, nargs="+", default=[1, 1.5, 2, 4])
    p.add_argument("--samples", type=int, default=500_000, help="generated set size")
    p.add_argument("--batch", type=int, default=1024, help="per rank (the CLI's default)")
    p.add_argument("--bound", type=int, default=100)
    p.add_argument("--max-lag", type=int, default=100)
    p.add_argument("--dense-sync-every", type=int, default=1)
    p.add_argument("--wait", choices=("sleep", "spin"), default="spin")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the user's command under torchrun, one GPU per rank",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="--device cuda: the process group (gloo lets several ranks share one GPU)",
    )
    p.add_argument(
        "--tree",
        type=Path,
        default=ROOT,
        help="--device cuda: the hetgmp checkout whose CLI runs (an A/B against an older "
        "commit: its tree, native extension built; default: this one)",
    )
    p.add_argument("--work", type=Path, default=Path("/tmp/hetgmp-bench-async"))
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "datasets")
    p.add_argument("--out", default="async_cpu", help="results name under bench/results/")
    a = p.parse_args()
    if 1 not in a.factors:
        p.error("--factors must include 1 (the no-straggler baseline)")
    if a.device == "cpu" and a.tree.resolve() != ROOT:
        p.error("--tree applies to --device cuda (CPU ranks run in this checkout's process)")
    a.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, data in datasets(a).items():
        for mode in a.modes:
            for f in a.factors:
                rows.append(run_one(a, name, data, mode, f))
    add_ratios(rows, a.ranks)
    write(a, rows)


if __name__ == "__main__":
    main()
