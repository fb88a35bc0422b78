"""One rank's part of the benchmark: build each contender, run the modes, measure, report.

``run_rank(env, cfg)`` is called on every rank (under torchrun, mpirun, one plain process or
:func:`hetgmp.comm.spawn.spawn_ranks`) with the same :class:`RunConfig`; it returns the result
records (identical on every rank) and, on rank 0, appends each record to ``cfg.jsonl`` as soon as
it is measured, so a later failure keeps what was already measured.

Per contender and configuration: ``warmup`` steps, ``steps`` timed steps (per-step wall time, no
extra syncs; CUDA events on GPU), then ``profile_steps`` steps with the phase split enabled (a
separate pass, so the timed pass is not slowed by it). Throughput is the global batch over the
median over steps of the slowest rank's step time. Bytes are what ranks send to other ranks,
summed over ranks, per global sample, over the timed steps.
"""

from __future__ import annotations

import dataclasses
import gc
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetgmp.comm.collectives import all_gather_object, barrier
from hetgmp.comm.env import DistEnv
from hetgmp.models import build_model
from hetgmp.partition.plan import load_plan

from . import contenders as C
from .data import load_workload, rank_samples
from .records import add_floor, result_record
from .steps import (  # re-exported: tests and the profiling tools import them from here
    RankData,
    batch_positions,
    embedding_step_fn,
    fixed_grad,
    train_step_fn,
)
from .timing import Phases, StepClock, copy_bandwidth, machine_info

__all__ = [
    "MODES",
    "PRECISIONS",
    "RankData",
    "RunConfig",
    "Runner",
    "batch_positions",
    "embedding_step",
    "embedding_step_fn",
    "fixed_grad",
    "run_rank",
    "write_json",
]

MODES = ("embedding", "train")
PRECISIONS = ("fp32", "bf16")


@dataclasses.dataclass
class RunConfig:
    """What one launch measures (every rank gets the same value)."""

    workload: str
    contenders: list[str]
    modes: list[str] = dataclasses.field(default_factory=lambda: ["embedding", "train"])
    batches: list[int] = dataclasses.field(default_factory=lambda: [8192, 65536])
    train_batches: list[int] | None = None  # default: batches
    models: list[str] = dataclasses.field(default_factory=lambda: ["wdl"])
    precisions: list[str] = dataclasses.field(default_factory=lambda: ["fp32", "bf16"])
    dim: int = 128
    warmup: int = 5
    steps: int = 20
    profile_steps: int = 5
    lr: float = 0.01
    dense_lr: float = 0.01
    seed: int = 0
    store_rate: float = 0.01
    jsonl: str | None = None
    return_rows: bool = False  # tests: append each contender's final rows to its records
    command: str = ""

    def check(self, world: int) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"--modes: unknown {bad}; choose from {MODES}")
        bad = [p for p in self.precisions if p not in PRECISIONS]
        if bad:
            raise ValueError(f"--precisions: unknown {bad}; choose from {PRECISIONS}")
        if min(self.steps, self.dim, *self.batches) < 1 or self.warmup < 0:
            raise ValueError("steps, dim and batch sizes must be >= 1, warmup >= 0")
        if "torch" in self.contenders and world != 1:
            raise ValueError("contender 'torch' is the one-GPU baseline: run it with 1 rank")


def _load_rank_data(wl: Any, part: np.ndarray | None, env: DistEnv) -> RankData:
    idx = rank_samples(part, int(wl.spec.num_samples), env.rank, env.world_size)
    if idx.size == 0:
        raise RuntimeError(f"rank {env.rank} has no samples in this assignment")
    take = idx if idx.size < wl.spec.num_samples else slice(None)
    dev = env.device
    return RankData(
        ids=torch.from_numpy(np.array(wl.ids()[take], dtype=np.int64)).to(dev),
        dense=torch.from_numpy(np.array(wl.dense()[take], dtype=np.float32)).to(dev),
        labels=torch.from_numpy(np.array(wl.labels()[take], dtype=np.float32)).to(dev),
    )


def _cleanup(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _peak_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


class Runner:
    """State shared by all configurations of one launch on one rank."""

    def __init__(self, env: DistEnv, cfg: RunConfig) -> None:
        cfg.check(env.world_size)
        self.env, self.cfg, self.dev = env, cfg, env.device
        self.wl = load_workload(cfg.workload)
        self.cards = np.asarray(self.wl.info["cardinalities"], dtype=np.int64)
        self.fields = self.wl.num_fields
        self.plan = None
        if any(c.startswith("hetgmp-b") for c in cfg.contenders):
            path = self.wl.plan_path()
            if path is None or self.wl.spec.world_size != env.world_size:
                raise ValueError(
                    f"contenders {cfg.contenders} need a plan for {env.world_size} ranks; "
                    f"{cfg.workload} was prepared for {self.wl.spec.world_size}"
                )
            self.plan = load_plan(path)
        self._data: dict[str, RankData] = {}
        self.records: list[dict[str, Any]] = []
        bw = copy_bandwidth(self.dev)
        self.copy_bw = min(all_gather_object(env, bw))
        self.machine = machine_info(self.dev)
        self.machine["copy_bandwidth_gbs"] = round(self.copy_bw / 1e9, 1)
        self.machine["world_size"] = env.world_size
        self.machine["backend"] = env.backend
        self._unique: dict[int, float] = {}

    # ------------------------------------------------------------------ data
    def data_for(self, contender: str) -> RankData:
        key = "plan" if contender.startswith("hetgmp-b") else "contiguous"
        if key not in self._data:
            part = self.plan.data_partition if key == "plan" else None
            self._data[key] = _load_rank_data(self.wl, part, self.env)
        return self._data[key]

    def unique_rows(self, batch: int) -> float:
        """Mean unique ids per batch on contiguous shards (for the bandwidth floor)."""
        if batch not in self._unique:
            d = self.data_for("contiguous")
            k = [
                torch.unique(
                    d.ids.index_select(0, batch_positions(s, batch, d.n, self.dev))
                ).numel()
                for s in range(3)
            ]
            self._unique[batch] = float(np.mean(k))
        return self._unique[batch]

    # ------------------------------------------------------------------ one configuration
    def measure(
        self, cont: C.Contender, data: RankData, *, mode: str, batch: int, model_name: str = "",
        precision: str = "fp32",
    ) -> dict[str, Any]:  # fmt: skip
        """One configuration: warm-up, timed steps, profiled steps, then the record (same on
        every rank)."""
        env, cfg, dev = self.env, self.cfg, self.dev
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        step = self._step_fn(cont, data, mode, batch, model_name, precision)
        mine = self._run_passes(cont, step)
        everyone = all_gather_object(env, mine)
        rec = result_record(
            everyone, mine, contender=cont.name, world=env.world_size, mode=mode,
            model_name=model_name, precision=precision, batch=batch, dim=cfg.dim,
            steps=cfg.steps, warmup=cfg.warmup, cuda=dev.type == "cuda",
        )  # fmt: skip
        if mode == "embedding":
            u = self.unique_rows(batch)
            add_floor(rec, fields=self.fields, unique_rows=u, copy_bw=self.copy_bw)
        return rec

    def _step_fn(
        self, cont: C.Contender, data: RankData, mode: str, batch: int, model_name: str,
        precision: str,
    ) -> Callable[[int], None]:  # fmt: skip
        """``step(k)`` of ``mode``: the fixed-gradient embedding step, or a fresh model's
        training step (same dense initial weights on every rank)."""
        env, cfg, dev = self.env, self.cfg, self.dev
        if mode == "embedding":
            grad = fixed_grad(batch, self.fields, cfg.dim, env.rank, cfg.seed, dev)
            return embedding_step_fn(cont, data.ids, grad, batch)
        torch.manual_seed(cfg.seed)  # same dense initial weights on every rank
        model = build_model(
            model_name, cont, num_fields=self.fields, num_dense=data.dense.shape[1],
            embed_dim=cfg.dim,
        ).to(dev)  # fmt: skip
        params = model.dense_parameters()
        opt = torch.optim.SGD(params, lr=cfg.dense_lr)
        return train_step_fn(
            cont, model, opt, params, data, env, batch=batch,
            global_batch=batch * env.world_size, autocast=precision == "bf16",
        )  # fmt: skip

    def _run_passes(self, cont: C.Contender, step: Callable[[int], None]) -> dict[str, Any]:
        """Warm-up, the timed pass and the profiled pass (phases on: a separate pass, so the
        timed one is not slowed by it); this rank's step times, bytes sent and row counters
        over the timed pass, phase times and peak memory."""
        cfg, dev = self.cfg, self.dev
        k = 0
        for _ in range(cfg.warmup):
            step(k)
            k += 1
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        barrier(self.env)
        bytes0, rows0 = cont.bytes_sent(), cont.counters()
        clock = StepClock(dev)
        for _ in range(cfg.steps):
            t0 = clock.tick()
            step(k)
            clock.tock(t0)
            k += 1
        secs = clock.seconds()
        bytes1, rows1 = cont.bytes_sent(), cont.counters()
        phases = Phases(dev, enabled=True)
        cont.set_timer(phases)
        for _ in range(cfg.profile_steps):
            phases.begin()
            step(k)
            phases.end()
            k += 1
        cont.set_timer(Phases(dev, enabled=False))
        sent = {kind: bytes1[kind] - bytes0[kind] for kind in bytes1}
        rows = {key: rows1[key] - rows0.get(key, 0) for key in rows1}
        return {
            "secs": secs, "sent": sent, "rows": rows, "phases": phases.ms_per_step(),
            "peak": _peak_gib(dev),
        }  # fmt: skip

    def emit(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)
        if self.env.rank == 0:
            if self.cfg.jsonl:
                with open(self.cfg.jsonl, "a") as f:
                    f.write(json.dumps({**rec, "machine": self.machine}) + "\n")
            extra = f" {rec['pct_of_floor']:.0f}% of floor" if "pct_of_floor" in rec else ""
            print(
                f"[bench] w={rec['world']} {rec['contender']:<12} {rec['mode']:<9} "
                f"{rec.get('model') or '':<4} {rec.get('precision') or '':<4} B={rec['batch_per_gpu']:<6} "
                f"{rec['samples_per_s'] / 1e6:8.3f} M samples/s  {rec['step_ms_median']:8.2f} ms/step  "
                f"{rec['bytes_per_sample']:9.1f} B/sample{extra}",
                flush=True,
            )

    # ------------------------------------------------------------------ all configurations
    def run(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        # Priority order if the time runs out: embedding-only first, then one model at a time.
        groups = []
        if "embedding" in cfg.modes:
            groups.append([("embedding", b, "", "fp32") for b in cfg.batches])
        if "train" in cfg.modes:
            for m in cfg.models:
                groups.append(
                    [
                        ("train", b, m, p)
                        for b in (cfg.train_batches or cfg.batches)
                        for p in cfg.precisions
                    ]
                )
        for group in groups:
            for name in cfg.contenders:
                data = self.data_for(name)
                cont = C.build(
                    name, cards=self.cards, dim=cfg.dim, env=self.env, lr=cfg.lr, seed=cfg.seed,
                    plan=self.plan, store_rate=cfg.store_rate,
                )  # fmt: skip
                for mode, b, m, p in group:
                    rec = self.measure(cont, data, mode=mode, batch=b, model_name=m, precision=p)
                    self.emit(rec)
                if cfg.return_rows:
                    ids, w = cont.rows()
                    self.records[-1]["rows"] = (ids.numpy(), w.numpy())
                del cont
                _cleanup(self.dev)
        return self.records


def embedding_step(
    env: DistEnv, workload: str, contender: str, *, batch: int, dim: int
) -> tuple[C.Contender, Any]:
    """``(contender, step)`` for tools that look at one contender's embedding-only step
    (``profile_step.py``, ``profile_host.py``): ``step(k)`` is :meth:`Runner.measure`'s step
    (the next batch's ids prefetched, the fixed gradient) on this rank's samples."""
    cfg = RunConfig(workload=workload, contenders=[contender], dim=dim)
    runner = Runner(env, cfg)
    data = runner.data_for(contender)
    cont = C.build(
        contender, cards=runner.cards, dim=dim, env=env, lr=cfg.lr, seed=cfg.seed,
        plan=runner.plan, store_rate=cfg.store_rate,
    ).to(env.device)  # fmt: skip
    dev = env.device
    grad = fixed_grad(batch, runner.fields, dim, env.rank, cfg.seed, dev)
    return cont, embedding_step_fn(cont, data.ids, grad, batch)


def run_rank(env: DistEnv, cfg: RunConfig | dict[str, Any]) -> dict[str, Any]:
    """Run every configuration of ``cfg`` on this rank; returns ``{"machine", "results"}``."""
    if isinstance(cfg, dict):
        cfg = RunConfig(**cfg)
    runner = Runner(env, cfg)
    results = runner.run()
    barrier(env)
    return {"machine": runner.machine, "command": cfg.command, "results": results}


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """Write results JSON (numpy rows, if any, left out)."""
    clean = {
        **payload,
        "results": [{k: v for k, v in r.items() if k != "rows"} for r in payload["results"]],
    }
    Path(path).write_text(json.dumps(clean, indent=2))
