"""Staleness ablation: how much staleness can training allow before accuracy suffers?

Runs the bounds (default 0, 1, 10, 100, 1000) at a fixed store rate, evaluating every
``--eval-every`` steps so the AUC curve over samples seen shows convergence speed, not only the
end point. Outputs in ``--out``: ``staleness.csv``, ``staleness.png``, ``staleness.md``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hetgmp.experiments import plots
from hetgmp.experiments.report import COMMON_COLUMNS, markdown_table, write_report
from hetgmp.experiments.sweep import (
    DEFAULT_BOUNDS,
    SweepOptions,
    ensure_plan,
    run_sweep,
    with_repeats,
)
from hetgmp.experiments.table import RunTable, aggregate

METRICS = (
    "val_auc", "val_logloss", "bytes_per_sample", "bytes_per_sample_ids",
    "bytes_per_sample_versions", "bytes_per_sample_values", "bytes_per_sample_gradients",
    "mirror_hit", "samples_per_s", "table_mb_max", "peak_rss_mb_max", "refreshed_rows_per_step",
)  # fmt: skip


def run_staleness(
    opts: SweepOptions,
    *,
    bounds: tuple[int, ...] = DEFAULT_BOUNDS,
    store_rate: float = 0.01,
    plan: Path | None = None,
) -> tuple[list[str], Path]:
    """Run (or resume) the ablation and write CSV, PNG, markdown; returns (errors, csv path)."""
    plots.require()  # before the runs: their plots are made after them
    if any(b < 0 for b in bounds):
        raise ValueError(f"--bounds must be >= 0, got {list(bounds)}")
    if not 0.0 <= store_rate <= 1.0:
        raise ValueError(f"--store-rate must lie in [0, 1], got {store_rate}")
    if opts.eval_every == 0:
        raise ValueError("the staleness ablation needs --eval-every > 0 (the AUC curve)")
    plan = plan or ensure_plan(
        opts.data, opts.workers, opts.out, batch_size=opts.batch_size, seed=opts.seed
    )
    base = opts.base_spec("staleness", plan=str(plan), method="plan", store_rate=store_rate)
    specs = with_repeats([dataclasses.replace(base, bound=b) for b in bounds], opts.repeats)
    table = RunTable(opts.out / "staleness.csv")
    errors = run_sweep(specs, table, opts.out / "runs", opts=opts)
    write_outputs(table, opts, store_rate)
    return errors, table.path


def write_outputs(table: RunTable, opts: SweepOptions, store_rate: float) -> None:
    """PNG and markdown from the CSV (all runs in it, aggregated over repeats)."""
    rows = [r for r in table.rows if r.get("status") == "ok"]
    if not rows:
        return
    agg = aggregate(rows, ["ranks", "store_rate", "bound"], METRICS)
    where = opts.where
    plots.plot_staleness(
        rows,
        agg,
        opts.out / "staleness.png",
        f"staleness ablation ({where}, store rate {store_rate:g})",
    )
    cols = (
        ("ranks", "ranks", "d"),
        ("store_rate", "store rate", "g"),
        ("bound", "bound", "d"),
        *COMMON_COLUMNS[:-1],
        ("refreshed_rows_per_step", "refreshed rows/step", ".1f"),
        COMMON_COLUMNS[-1],
    )
    text = (
        f"Data `{opts.data}`, {where}, batch {opts.batch_size}/rank, {opts.iters} steps, "
        f"evaluation every {opts.eval_every} steps, dim {opts.embed_dim}, {opts.model}, "
        f"{opts.optimizers}, "
        f"{opts.repeats} repeat(s)."
    )
    write_report(
        opts.out / "staleness.md",
        "staleness ablation",
        text,
        markdown_table(agg, cols),
        "staleness.png",
    )
