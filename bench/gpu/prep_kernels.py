"""The batch plan alone (diagnosis): ``BatchPlanner.prepare`` in torch ops (the reference) vs
the five fused Triton kernels (``hetgmp/embedding/kernels/prep.py``), same inputs, checked
equal element for element (``u / cnt / slot`` on the distinct rows: past them, padding, which
the fused plan leaves as it was).

Table: Criteo Kaggle shape (33.8M rows, scaled by ``--card-scale``); ids per field Zipf-like
(a continuous power law with the field's fitted exponent, ``CRITEO_ZIPF_EXPONENTS``, floored);
rank 0's block map: a random owner per row, the hottest 1 % of each field's rows mirrored
when not owned, the rest not stored. Per world size and batch: median of CUDA-event timings of
``--reps`` calls each, interleaved, eager (host launches included) and replayed from a CUDA
graph (device time: how the padded exchange runs it; CUDA only); the distinct rows; whether
all fields are equal (twice for Triton: its leader map must be left as found). Prints a markdown table; ``--out DIR`` also writes ``prep_kernels.{json,md}``.

    python bench/gpu/prep_kernels.py [--out bench/results/gpu]
    TRITON_INTERPRET=1 python bench/gpu/prep_kernels.py --device cpu --card-scale 1e-4 \
        --batches 64 --reps 2   # (a smoke run of this script)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.gpu.timing import interleaved_seconds, machine_info  # noqa: E402
from hetgmp.data.generate import CRITEO_CARDINALITIES, CRITEO_ZIPF_EXPONENTS  # noqa: E402
from hetgmp.embedding.batch import BatchPlanner  # noqa: E402
from hetgmp.embedding.kernels import prep as prep_kernels  # noqa: E402

FIELDS = ("bad", "u", "cnt", "slot", "inv", "blocks")


def zipf_ids(batch: int, cards: np.ndarray, g: torch.Generator, dev: torch.device) -> torch.Tensor:
    """``[batch, F]`` global ids: field f's rank ``floor(x) - 1`` with ``x`` drawn from a
    power law of exponent ``s_f`` on ``[1, card_f + 1)`` (inverse CDF), plus the field offset."""
    c = torch.from_numpy(cards).to(dev, torch.float64)
    s = torch.tensor(CRITEO_ZIPF_EXPONENTS[: len(cards)], dtype=torch.float64, device=dev)
    u = torch.rand(batch, len(cards), generator=g, device=dev, dtype=torch.float64)
    one = (s - 1).abs() < 1e-3
    a = torch.where(one, torch.ones_like(s) * 2, 1 - s)  # (no division by 0 where s ~ 1)
    x = ((torch.pow(c + 1, a) - 1) * u + 1).pow(1 / a)
    x = torch.where(one, torch.pow(c + 1, u), x)
    rank = (x.floor().long() - 1).clamp(min=0)
    rank = torch.minimum(rank, torch.from_numpy(cards - 1).to(dev))
    offs = torch.from_numpy(np.concatenate([[0], np.cumsum(cards)[:-1]])).to(dev)
    return rank + offs


def maps(cards: np.ndarray, world: int, g: torch.Generator, dev: torch.device) -> tuple:
    """Rank 0's ``slot_of`` / ``block_of`` (int32): own rows key 0, mirrors ``w + owner``
    (the hottest 1 % of a field), the rest ``2w + owner``."""
    rows = int(cards.sum())
    owner = torch.randint(0, world, (rows,), generator=g, device=dev, dtype=torch.int32)
    offs = np.concatenate([[0], np.cumsum(cards)[:-1]])
    within = torch.arange(rows, device=dev) - torch.from_numpy(np.repeat(offs, cards)).to(dev)
    hot = within < torch.from_numpy(np.repeat(np.maximum(cards // 100, 1), cards)).to(dev)
    block = torch.where(owner == 0, 0, torch.where(hot, world + owner, 2 * world + owner))
    stored = block < 2 * world
    slot = torch.where(stored, torch.cumsum(stored.int(), 0) - 1, -1)
    return slot.int(), block.int()


def _graphed(fn: Any, dev: torch.device) -> Any:
    """``fn`` captured in a CUDA graph (after a warm-up on a side stream); returns its replay."""
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _time(fns: dict[str, Any], reps: int, dev: torch.device) -> dict[str, float]:
    """Median microseconds per call of each of ``fns`` (``timing.interleaved_seconds``)."""
    return {k: 1e6 * v for k, v in interleaved_seconds(fns, reps, dev).items()}


def measure(world: int, batch: int, cards: np.ndarray, reps: int, dev: torch.device) -> dict:
    """One world size and batch: timings of both backends and their agreement."""
    g = torch.Generator(device=dev).manual_seed(world * 7919 + batch)
    slot_of, block_of = maps(cards, world, g, dev)
    ids = zipf_ids(batch, cards, g, dev)
    ref, tri = (BatchPlanner(slot_of, block_of, world, dev, backend=b) for b in ("torch", "triton"))
    a, b = ref.prepare(ids), tri.prepare(ids)
    b2 = tri.prepare(ids)  # (the leader map is left as found: a second call agrees)
    k = int(a.blocks.sum())  # (u / cnt / slot: equal on the distinct rows; padding unspecified)
    equal = all(
        torch.equal(getattr(a, f)[:k], getattr(x, f)[:k]) if f in ("u", "cnt", "slot")
        else torch.equal(getattr(a, f), getattr(x, f))
        for f in FIELDS for x in (b, b2)
    )  # fmt: skip
    equal &= all(getattr(a, f).dtype == getattr(b, f).dtype for f in FIELDS)
    fns = {"torch": lambda: ref.prepare(ids), "triton": lambda: tri.prepare(ids)}
    if dev.type == "cuda":
        fns |= {f"{k} graph": _graphed(f, dev) for k, f in list(fns.items())}
    us = _time(fns, reps, dev)
    return {
        "world": world, "batch": batch, "n": ids.numel(), "rows": int(slot_of.numel()),
        "distinct": int(a.blocks.sum()), "blocks": a.blocks.tolist(), "equal": bool(equal),
        **{f"us {k}": v for k, v in us.items()},
    }  # fmt: skip


def markdown(info: dict, recs: list[dict], cmd: str) -> str:
    lines = [
        "# Batch plan: torch reference vs fused Triton (bench/gpu/prep_kernels.py)", "",
        f"{info.get('gpu') or info['device']}, torch {info['torch']}, {info['date']}; "
        f"command: `{cmd}`", "",
        "| world | batch x F | mark samples | n | distinct | torch us | Triton us | "
        "torch graph us | Triton graph us | graph speed-up | equal |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    nan = float("nan")
    for r in recs:
        tg, kg = r.get("us torch graph", nan), r.get("us triton graph", nan)
        lines.append(
            f"| {r['world']} | {r['batch']} x 26 | {r.get('mark_samples', '')} | {r['n']:,} | "
            f"{r['distinct']:,} | "
            f"{r['us torch']:.0f} | {r['us triton']:.0f} | {tg:.0f} | {kg:.0f} | "
            f"{tg / kg:.2f}x | {'yes' if r['equal'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def plan_args(doc: str, worlds: str, reps: int) -> argparse.ArgumentParser:
    """The options this script shares with ``prep_kernel_split.py`` (same inputs)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--batches", default="8192,65536")
    ap.add_argument("--worlds", default=worlds)
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--card-scale", type=float, default=1.0, help="1.0 = Criteo Kaggle rows")
    ap.add_argument(
        "--device", default="cuda", help="cpu: a smoke run (TRITON_INTERPRET=1, small scale)"
    )
    return ap


def card_rows(scale: float) -> np.ndarray:
    """Criteo Kaggle's field cardinalities times ``scale`` (at least 1 row a field)."""
    return np.maximum((np.array(CRITEO_CARDINALITIES) * scale).astype(np.int64), 1)


def main() -> int:
    ap = plan_args(__doc__ or "", "2,4", 50)
    ap.add_argument("--mark-samples", default=str(prep_kernels.MARK_SAMPLES),
                    help="samples per program of the leader marking by field (prep.MARK_SAMPLES), "
                    "comma-separated powers of 2: a sweep")  # fmt: skip
    a = ap.parse_args()
    dev = torch.device(a.device)
    cards = card_rows(a.card_scale)
    recs = []
    for bs in map(int, a.mark_samples.split(",")):
        prep_kernels.MARK_SAMPLES = bs
        recs += [
            {**measure(w, int(b), cards, a.reps, dev), "mark_samples": bs}
            for w in map(int, a.worlds.split(","))
            for b in a.batches.split(",")
        ]
    info = machine_info(dev)
    text = markdown(info, recs, " ".join(sys.argv))
    print(text)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "prep_kernels.json").write_text(json.dumps({"info": info, "runs": recs}, indent=1))
        (out / "prep_kernels.md").write_text(text)
    return 0 if all(r["equal"] for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
