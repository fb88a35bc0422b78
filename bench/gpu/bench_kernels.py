"""The row kernels alone, same inputs: the row update (torch ``index_add_`` vs hetgmp's Triton
``scatter_add_rows``) and the row gather (torch ``index_select`` vs hetgmp's Triton ``take_rows``).

Table: Criteo Kaggle shape (33.8M rows x D, float32); ids: ``floor(u^4 * card)`` per field plus
the field offsets (the benchmark's id law, so hot rows repeat as in training); gradient: random.
Per batch size and kernel: median of CUDA-event timings over ``--reps`` calls of each backend,
interleaved; for the update the maximum difference between the two results (atomics make the
order of the additions, hence the last bits, differ), for the gather whether the two are equal
(bit for bit; it runs after the update, so the rows read are not zeros). Writes ``kernels.json``
and ``kernels.md`` under ``--out``.

    python bench/gpu/bench_kernels.py --out bench/results/gpu
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.gpu.timing import interleaved_seconds, machine_info  # noqa: E402
from hetgmp.data.generate import CRITEO_CARDINALITIES  # noqa: E402
from hetgmp.embedding.kernels import scatter_add_rows, take_rows  # noqa: E402


def _ids(batch: int, cards: np.ndarray, g: torch.Generator, dev: torch.device) -> torch.Tensor:
    offs = torch.from_numpy(np.concatenate([[0], np.cumsum(cards)[:-1]])).to(dev)
    u = torch.rand(batch, len(cards), generator=g, device=dev)
    c = torch.from_numpy(cards).to(dev)
    return ((u**4 * c).long().clamp(max=c - 1) + offs).reshape(-1)


def _time(fns: dict, reps: int, dev: torch.device) -> dict[str, float]:
    """Median ms per call of each of ``fns`` (``timing.interleaved_seconds``)."""
    return {k: 1e3 * v for k, v in interleaved_seconds(fns, reps, dev).items()}


def _launch_overhead(dev: torch.device, calls: int = 2000) -> dict[str, float]:
    """Host microseconds per call of each row op on a 64 x 8 table (the device work is
    negligible, so this is what a host-bound step pays per launch)."""
    table = torch.zeros(64, 8, device=dev)
    idx = torch.arange(16, device=dev)
    src = torch.ones(16, 8, device=dev)
    ops = {
        "torch index_select": lambda: table.index_select(0, idx),
        "torch index_add_": lambda: table.index_add_(0, idx, src),
        "triton take_rows": lambda: take_rows(table, idx, backend="triton"),
        "triton scatter_add_rows": lambda: scatter_add_rows(table, idx, src, backend="triton"),
    }
    got = {}
    for name, fn in ops.items():
        for _ in range(20):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        got[name] = 1e6 * (time.perf_counter() - t0) / calls
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    return got


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batches", default="8192,65536")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--card-scale", type=float, default=1.0, help="1.0 = Criteo Kaggle rows")
    ap.add_argument(
        "--device", default="cuda", help="cpu: a smoke run (set TRITON_INTERPRET=1, small scale)"
    )
    return ap.parse_args()


def _measure_batch(
    batch: int,
    table: torch.Tensor,
    cards: np.ndarray,
    g: torch.Generator,
    a: argparse.Namespace,
    dev: torch.device,
) -> dict[str, Any]:
    """One batch size: update and gather timings of both backends, their agreement, GB/s."""
    idx = _ids(batch, cards, g, dev)
    src = torch.randn(idx.numel(), a.dim, generator=g, device=dev)
    uniq = int(torch.unique(idx).numel())
    fns = {
        k: (lambda k=k, i=idx, s=src: scatter_add_rows(table, i, s, -0.01, backend=k))
        for k in ("torch", "triton")
    }
    ms = _time(fns, a.reps, dev)
    # the gather of the same ids from the same table (its rows updated above)
    gms = _time(
        {
            "torch": lambda i=idx: table.index_select(0, i),
            "triton": lambda i=idx: take_rows(table, i, backend="triton"),
        },
        a.reps,
        dev,
    )
    same = torch.equal(take_rows(table, idx, backend="triton"), table.index_select(0, idx))
    # same result (up to the order of float additions)
    t0 = torch.randn(uniq, a.dim, generator=g, device=dev)
    loc = torch.unique(idx, return_inverse=True)[1]
    r_t = scatter_add_rows(t0.clone(), loc, src, -0.01, backend="torch")
    r_k = scatter_add_rows(t0.clone(), loc, src, -0.01, backend="triton")
    diff = float((r_t - r_k).abs().max())
    moved = idx.numel() * a.dim * 4 * 3  # read src, read + write the table row
    g_moved = idx.numel() * a.dim * 4 * 2  # read the table row, write the output row
    rec = {
        "batch": batch,
        "rows_added": idx.numel(),
        "unique_rows": uniq,
        "dim": a.dim,
        "ms_torch": ms["torch"],
        "ms_triton": ms["triton"],
        "max_abs_diff": diff,
        "triton_gbs": moved / ms["triton"] / 1e6,
        "gather_ms_torch": gms["torch"],
        "gather_ms_triton": gms["triton"],
        "gather_equal": same,
        "gather_torch_gbs": g_moved / gms["torch"] / 1e6,
        "gather_triton_gbs": g_moved / gms["triton"] / 1e6,
    }
    rec["speedup"] = rec["ms_torch"] / rec["ms_triton"]
    rec["gather_speedup"] = rec["gather_ms_torch"] / rec["gather_ms_triton"]
    return rec


def _markdown(
    info: dict[str, Any], recs: list[dict[str, Any]], launch: dict[str, float], rows: int,
    a: argparse.Namespace,
) -> str:  # fmt: skip
    """``kernels.md``: the update table, the gather table, the host time per call."""
    lines = [
        "# Row kernels: torch vs hetgmp Triton (bench/gpu/bench_kernels.py)",
        "",
        f"{info['gpu'] or info['device']}, torch {info['torch']}, {info['date']}; table {rows:,} x {a.dim} float32; "
        f"ids floor(u^4 * card) per Criteo field; median of {a.reps} interleaved calls each.",
        f"Command: `{info['command']}`",
        "",
        "## Row update: torch index_add_ vs Triton scatter_add_rows",
        "",
        "| batch | rows added | unique rows | torch ms | Triton ms | speed-up | Triton GB/s* | max abs diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        lines.append(
            f"| {r['batch']} | {r['rows_added']:,} | {r['unique_rows']:,} | {r['ms_torch']:.3f} | "
            f"{r['ms_triton']:.3f} | {r['speedup']:.2f}x | {r['triton_gbs']:.0f} | {r['max_abs_diff']:.1e} |"
        )
    lines += [
        "",
        "*bytes of gradient read + row read + row written per added row, over the time.",
        "",
        "## Row gather: torch index_select vs Triton take_rows (same ids, same table)",
        "",
        "| batch | rows read | torch ms | Triton ms | speed-up | torch GB/s* | Triton GB/s* | equal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        lines.append(
            f"| {r['batch']} | {r['rows_added']:,} | {r['gather_ms_torch']:.3f} | "
            f"{r['gather_ms_triton']:.3f} | {r['gather_speedup']:.2f}x | "
            f"{r['gather_torch_gbs']:.0f} | {r['gather_triton_gbs']:.0f} | "
            f"{'yes' if r['gather_equal'] else 'NO'} |"
        )
    lines += ["", "*bytes of row read + output row written per row read, over the time."]
    lines += [
        "",
        "## Host time per call (tiny tensors: launch overhead, no device wait)",
        "",
        "| call | host us |",
        "|---|---|",
        *(f"| {k} | {v:.1f} |" for k, v in launch.items()),
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    a = _parse_args()
    dev = torch.device(a.device)
    cards = np.maximum(2, np.round(np.asarray(CRITEO_CARDINALITIES) * a.card_scale)).astype(
        np.int64
    )
    rows = int(cards.sum())
    table = torch.zeros(rows, a.dim, device=dev)
    g = torch.Generator(device=dev).manual_seed(0)
    recs = []
    for batch in (int(x) for x in a.batches.split(",")):
        rec = _measure_batch(batch, table, cards, g, a, dev)
        recs.append(rec)
        print(json.dumps(rec), flush=True)
    launch = _launch_overhead(dev, 2000 if dev.type == "cuda" else 20)
    print(json.dumps({"host_us_per_call": launch}), flush=True)
    info = machine_info(dev)
    info.update(command="python " + " ".join(sys.argv), table_rows=rows)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"info": info, "results": recs, "host_us_per_call": launch}
    (out / "kernels.json").write_text(json.dumps(payload, indent=1))
    (out / "kernels.md").write_text(_markdown(info, recs, launch, rows, a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
