"""Host overhead of one DistributedEmbedding step on CPU: aten ops per step and step time.

The GPU benchmark showed hetgmp's embedding step is bound by host work (ops launched, syncs,
allocations), not bytes; that cost is visible on CPU too when the batch is small enough that
kernels are cheap. This counts the aten ops of a step with ``torch.profiler`` (CPU activities,
top-level ops only, so ``index_select`` is one op, not its internal ``empty`` + ``copy_``) and
times many steps, on 1 process and on spawned gloo ranks.

    python bench/step_ops.py --world 1 2 --batch 64 --steps 200
    # before/after in one run (the box is noisy): an older distributed.py, steps interleaved
    git show HEAD~1:hetgmp/embedding/distributed.py > /tmp/old.py
    python bench/step_ops.py --baseline /tmp/old.py
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.embedding import DistributedEmbedding
from hetgmp.partition.plan import Plan

ROWS, FIELDS = 20_000, 26


def _plan(world: int, seed: int = 0) -> Plan:
    rng = np.random.default_rng(seed)
    owner = rng.integers(0, world, ROWS).astype(np.int32)
    # mirror priority: hot (low) ids first, as a partitioner would rank them for u^4 ids
    mirrors = [np.flatnonzero(owner != w).astype(np.int64) for w in range(world)]
    return Plan(np.zeros(world, np.int32), owner, mirrors, {})


def _batches(rank: int, batch: int, n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    return [(torch.rand(batch, FIELDS, generator=g) ** 4 * ROWS).long() for _ in range(n)]


class _RangeTimer:
    """Duck-types the runtime's PhaseTimer: each ``mark(phase)`` closes a profiler range that
    is labelled with ``phase`` afterwards (the label is only known when the range ends)."""

    def __init__(self) -> None:
        self.enabled, self.labels, self._n, self._h = True, {}, 0, None

    def _open(self) -> None:
        self._h = torch.ops.profiler._record_function_enter_new(f"seg{self._n}", None)

    def start(self) -> None:
        self.mark("preprocess")

    def mark(self, phase: str) -> None:
        if self._h is not None:
            torch.ops.profiler._record_function_exit._RecordFunction(self._h)
            self.labels[f"seg{self._n}"] = phase
            self._n += 1
        self._open()

    def close(self, phase: str) -> None:
        self.mark(phase)
        torch.ops.profiler._record_function_exit._RecordFunction(self._h)
        self._h = None


def _impl(path: str | None) -> type:
    """``DistributedEmbedding`` of this tree, or of a copy of ``distributed.py`` at ``path``."""
    if path is None:
        return DistributedEmbedding
    spec = importlib.util.spec_from_file_location("hetgmp.embedding._baseline", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod.DistributedEmbedding


def run(env: DistEnv, cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per implementation (``new`` and, with a baseline, ``old``): median step time over
    ``cfg['steps']`` steps (timed in interleaved blocks of 10), then a profile of
    ``cfg['prof']`` steps on this rank."""
    torch.set_num_threads(1)
    plan = _plan(env.world_size) if env.world_size > 1 else None
    impls = {"new": _impl(None)}
    if cfg.get("baseline"):
        impls["old"] = _impl(cfg["baseline"])
    embs = {
        k: cls(
            ROWS, cfg["dim"], env, plan, store_rate=cfg["store_rate"] if plan else 0.0,
            bound=cfg["bound"],
            **({"replies": cfg["replies"]} if k == "new" else {}),
        )
        for k, cls in impls.items()
    }  # fmt: skip
    n = cfg["warmup"] + cfg["steps"] + cfg["prof"]
    bs = _batches(env.rank, cfg["batch"], n)
    g = torch.randn(cfg["batch"], FIELDS, cfg["dim"])
    for emb in embs.values():
        for k in range(cfg["warmup"]):
            emb(bs[k]).backward(g)
    secs: dict[str, list[float]] = {k: [] for k in embs}
    for b0 in range(cfg["warmup"], cfg["warmup"] + cfg["steps"], 10):
        for name, emb in embs.items():
            for k in range(b0, min(b0 + 10, cfg["warmup"] + cfg["steps"])):
                t0 = time.perf_counter()
                emb(bs[k]).backward(g)
                secs[name].append(time.perf_counter() - t0)
    out = {}
    for name, emb in embs.items():
        out[name] = _profile(emb, bs[n - cfg["prof"] :], g)
        out[name]["median_ms"] = 1e3 * statistics.median(secs[name])
    return out


def _profile(emb: torch.nn.Module, bs: list[torch.Tensor], g: torch.Tensor) -> dict[str, Any]:
    """Top-level aten ops per step, in total, by op and by the runtime's phases."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    timer = _RangeTimer()
    emb.timer = timer  # type: ignore[assignment]
    with torch.profiler.profile(activities=acts) as prof:
        for ids in bs:
            timer.mark("other")
            out = emb(ids)
            out.backward(g)
            timer.close("backward")
    # Top-level aten ops only (no parent aten op): what the step itself launches.
    events = prof.events()
    counts: collections.Counter[str] = collections.Counter()
    by_phase: collections.Counter[str] = collections.Counter()
    by_phase_op: collections.Counter[str] = collections.Counter()
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        p, seg = e.cpu_parent, "?"
        while p is not None and not p.name.startswith("aten::"):
            if p.name.startswith("seg"):
                seg = timer.labels.get(p.name, "?")
                break
            p = p.cpu_parent
        if p is None or p.name.startswith("seg"):
            counts[e.name] += 1
            by_phase[seg] += 1
            by_phase_op[f"{seg} {e.name}"] += 1
    emb.timer.enabled = False
    per_step = {k: v / len(bs) for k, v in counts.most_common()}
    phases = {k: v / len(bs) for k, v in by_phase.most_common()}
    phase_ops = {k: v / len(bs) for k, v in sorted(by_phase_op.items())}
    return {"ops_per_step": per_step, "phases": phases, "phase_ops": phase_ops}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--prof", type=int, default=5)
    ap.add_argument("--bound", type=int, default=100)
    ap.add_argument("--replies", default="stale", choices=("stale", "all"))
    ap.add_argument("--store-rate", type=float, default=0.05)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", default=None)
    ap.add_argument("--baseline", default=None, help="another distributed.py to compare with")
    a = ap.parse_args()
    cfg = {k: getattr(a, k) for k in ("batch", "dim", "steps", "warmup", "prof", "bound")}
    cfg["store_rate"], cfg["baseline"] = a.store_rate, a.baseline
    cfg["replies"] = a.replies
    out = {}
    for w in a.world:
        res = [run(DistEnv.single(), cfg)] if w == 1 else spawn_ranks(run, w, cfg, timeout_s=900)
        out[w] = {}
        for name, r0 in res[0].items():
            total = sum(r0["ops_per_step"].values())
            ms = [round(r[name]["median_ms"], 3) for r in res]
            print(f"world {w} {name}: {total:.0f} top-level aten ops/step (rank 0), median ms {ms}")
            print("  by phase:", r0["phases"])
            for k, v in list(r0["ops_per_step"].items())[: a.top]:
                print(f"  {v:6.1f}  {k}")
            out[w][name] = {"ops_per_step_total": total, "median_ms": ms, **r0}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
