"""Shared sweep machinery: options, plans, the run loop with resume, a bar, one line per run.

A sweep is a list of :class:`RunSpec` (every combination times ``repeats``; repeat ``i`` uses seed
``seed + i``). :func:`run_sweep` skips the runs whose key is already in the CSV, launches the
others one after another (each is itself a multi-rank job), appends each finished run to the
CSV at once, prints one line with its key figures and advances a tqdm bar over the whole sweep.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from hetgmp.config import add_arguments, from_namespace, option
from hetgmp.config_file import add_config_option
from hetgmp.experiments.launch import (
    LaunchError,
    RunSpec,
    check_spec,
    find_mpirun,
    run_one,
    train_field,
)
from hetgmp.experiments.table import Row, RunTable
from hetgmp.progress import auto_unless_off, bar_wanted
from hetgmp.train.dense_lr import resolve_dense_lr

DEFAULT_TIMEOUT_S = 1800.0
# The sweeps' default grids (here, not in their modules, which import matplotlib and torch:
# the experiment parsers, and so --help, do without both)
DEFAULT_STORE_RATES = (0.0, 0.001, 0.003, 0.01, 0.03, 0.1)
DEFAULT_BOUNDS = (0, 1, 10, 100, 1000)
DEFAULT_PARTS = (2, 4, 8)


def _at_least(n: int) -> Any:
    return {"check": lambda v: v >= n, "check_msg": f"must be >= {n}"}


def train_option(name: str) -> Any:
    """A sweep option that is ``hetgmp train``'s option ``name``: the same flag, default, help,
    choices and check, taken from :class:`hetgmp.train.config.TrainConfig` (not copied)."""
    f = train_field(name)
    md = f.metadata
    return option(
        f.default,
        help=md["help"],
        choices=md.get("choices"),
        check=md.get("check"),
        check_msg=md.get("check_msg", ""),
    )


@dataclasses.dataclass
class SweepOptions:
    """Options every experiment shares (typed and validated through :mod:`hetgmp.config`)."""

    data: Path = option(help="dataset directory")
    out: Path = option(help="output directory (CSV, PNG, markdown, runs/, plans/)")
    ranks: int = option(
        8, help="CPU ranks per run (mpirun -np)", flags=("--ranks", "--np", "-n"), **_at_least(1)
    )
    gpus: int = option(
        0, help="run on this many GPUs (one rank each) instead of CPU ranks", **_at_least(0)
    )
    batch_size: int = option(
        128, help="samples per rank per step", flags=("--batch-size", "--batch_size"),
        **_at_least(1),
    )  # fmt: skip
    embed_dim: int = option(
        16, help="embedding dimension", flags=("--embed-dim", "--embed_dim"), **_at_least(1)
    )
    iters: int = option(
        100, help="global training steps per run", flags=("--iters", "--iter"), **_at_least(1)
    )
    eval_every: int = option(
        0, help="steps between evaluations (0: only at the end)", **_at_least(0)
    )
    # The optimizers default to hetgmp train's (row-wise Adagrad for the rows, Adam for the MLPs).
    optimizer: str = train_option("optimizer")
    lr: float = train_option("lr")
    adagrad_init: float = train_option("adagrad_init")
    dense_optimizer: str = train_option("dense_optimizer")
    dense_lr: float | None = train_option("dense_lr")
    model: str = train_option("model")
    seed: int = option(0, help="seed of repeat 0 (repeat i: seed + i)")
    repeats: int = option(1, help="runs per setting (mean and spread)", **_at_least(1))
    threads: int = option(1, help="torch threads per CPU rank", **_at_least(1))
    timeout_s: float = option(
        DEFAULT_TIMEOUT_S,
        help="seconds one run may take",
        flags=("--timeout-s", "--timeout_s", "--timeout"),
    )
    progress: bool = option(True, help="progress bar over the sweep")

    @property
    def workers(self) -> int:
        return self.gpus if self.gpus else self.ranks

    @property
    def where(self) -> str:
        """'<data set>, <n> GPUs|CPU ranks' for plot titles and tables."""
        return f"{Path(self.data).name}, {self.workers} {'GPUs' if self.gpus else 'CPU ranks'}"

    @property
    def effective_dense_lr(self) -> float:
        """The dense learning rate the runs train with (``hetgmp train``'s rule when not given)."""
        return resolve_dense_lr(self.lr, self.dense_optimizer, self.dense_lr)

    @property
    def optimizers(self) -> str:
        """The optimizer settings in words, for the reports."""
        sparse = f"sparse {self.optimizer} lr {self.lr:g}"
        if self.optimizer == "adagrad":
            sparse += f" (initial accumulator {self.adagrad_init:g})"
        return f"{sparse}, dense {self.dense_optimizer} lr {self.effective_dense_lr:g}"

    def base_spec(self, experiment: str, **kw: Any) -> RunSpec:
        """A spec with these options; ``kw`` sets or overrides any other :class:`RunSpec` field.

        The dense learning rate is resolved (``hetgmp train``'s rule when not given), so the CSV
        holds the value the run trained with."""
        fields: dict[str, Any] = {
            "experiment": experiment,
            "dataset": str(self.data),
            "ranks": self.workers,
            "batch_size": self.batch_size,
            "embed_dim": self.embed_dim,
            "iters": self.iters,
            "eval_every": self.eval_every,
            "lr": self.lr,
            "optimizer": self.optimizer,
            "dense_optimizer": self.dense_optimizer,
            "dense_lr": self.dense_lr,
            "adagrad_init": self.adagrad_init,
            "model": self.model,
            "seed": self.seed,
            "gpus": self.gpus,
        }
        spec = RunSpec(**{**fields, **kw})
        return dataclasses.replace(spec, dense_lr=spec.effective_dense_lr)


def add_common_arguments(p: argparse.ArgumentParser, *, eval_every: int = 0) -> None:
    """The options of :class:`SweepOptions` on an experiment's parser."""
    add_config_option(p)
    add_arguments(p, SweepOptions)
    for action in p._actions:  # the staleness sweep evaluates along the way by default
        if action.dest == "eval_every":
            action.default = eval_every
            action.help = f"steps between evaluations (0: only at the end) (default: {eval_every})"


def options_from(args: argparse.Namespace) -> SweepOptions:
    """The sweep's options, every one checked before a plan is made or a run launched: the
    data set, mpirun, and the training options the runs will get (issue 32)."""
    opts = from_namespace(SweepOptions, args)
    if not (opts.data / "meta.json").exists():
        raise FileNotFoundError(f"--data {opts.data}: no meta.json (not a dataset directory)")
    find_mpirun()
    check_spec(opts.base_spec("check"), opts.out / "runs" / "check", threads=opts.threads)
    return opts


def check_grid(opts: SweepOptions, **grids: Sequence[Any]) -> None:
    """Every value of every swept option (``store_rate=(0.0, 0.1)``) checked as ``hetgmp train``
    checks it, before anything is partitioned or launched; raises ``ValueError``."""
    base = opts.base_spec("check")
    for name, values in grids.items():
        for v in values:
            check_spec(dataclasses.replace(base, **{name: v}), opts.out, threads=opts.threads)


def with_repeats(specs: Sequence[RunSpec], repeats: int) -> list[RunSpec]:
    """Each spec ``repeats`` times, repeat ``i`` with seed ``seed + i``."""
    return [
        dataclasses.replace(s, repeat=i, seed=s.seed + i) for s in specs for i in range(repeats)
    ]


def ensure_plan(
    data: Path,
    parts: int,
    out: Path,
    *,
    method: str = "metis+refine",
    batch_size: int,
    seed: int = 0,
    max_mirror_rate: float = 0.25,
) -> Path:
    """A plan for ``data`` in ``parts`` (made once, then reused from ``out/plans``)."""
    from hetgmp.data.format import open_dataset
    from hetgmp.partition.api import partition_dataset
    from hetgmp.partition.plan import save_plan

    path = out / "plans" / f"{method.replace('+', '_')}-p{parts}-b{batch_size}-s{seed}.npz"
    if not path.exists():
        plan = partition_dataset(
            open_dataset(data),
            parts,
            method=method,
            batch_size=batch_size,
            seed=seed,
            max_mirror_rate=max_mirror_rate,
            progress=False,
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        save_plan(plan, path)
    return path


def summary(row: Row) -> str:
    """The key figures of one finished run, on one line."""

    def f(name: str, fmt: str) -> str:
        v = row.get(name)
        return "-" if v is None or v == "" else format(float(v), fmt)

    return (
        f"{row['label']}: auc {f('val_auc', '.4f')} logloss {f('val_logloss', '.4f')} "
        f"bytes/sample {f('bytes_per_sample', '.1f')} mirror_hit {f('mirror_hit', '.3f')} "
        f"samples/s {f('samples_per_s', '.0f')} table {f('table_mb_max', '.1f')} MB "
        f"rss {f('peak_rss_mb_max', '.0f')} MB ({f('wall_seconds', '.0f')} s)"
    )


def run_sweep(
    specs: Sequence[RunSpec],
    table: RunTable,
    runs_dir: Path,
    *,
    opts: SweepOptions,
    extra: Callable[[RunSpec, Row], None] | None = None,
    stream: TextIO | None = None,
) -> list[str]:
    """Run every spec not yet in ``table``; returns the errors of failed runs (others go on)."""
    stream = stream or sys.stdout
    todo = [s for s in specs if not table.has(s.key)]
    skipped = len(specs) - len(todo)
    print(
        f"{len(specs)} runs, {skipped} already in {table.path}, {len(todo)} to run",
        file=stream,
        flush=True,
    )
    errors: list[str] = []
    bar = tqdm(
        total=len(specs),
        initial=skipped,
        unit="run",
        dynamic_ncols=True,
        disable=not bar_wanted(auto_unless_off(opts.progress)),
    )
    try:
        for spec in todo:
            bar.set_postfix_str(spec.label)
            try:
                row = run_one(spec, runs_dir, timeout_s=opts.timeout_s, threads=opts.threads)
            except LaunchError as err:
                errors.append(str(err))
                bar.write(f"FAILED {err}", file=stream)
                bar.update(1)
                continue
            if extra is not None:
                extra(spec, row)
            table.add(row)
            bar.write(summary(row), file=stream)
            bar.update(1)
    finally:
        bar.close()
    return errors
