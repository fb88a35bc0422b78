"""Store-rate sweep: how many rows should each worker mirror?

For one data set, one plan (made with ``metis+refine`` at the run's batch size when not given)
and a list of store rates, runs real multi-rank training at a fixed bound and records bytes per
sample by kind, mirror hit rate, memory per worker, samples/s, final AUC and logloss.
Outputs in ``--out``: ``store_rate.csv``, ``store_rate.png``, ``store_rate.md``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hetgmp.experiments import plots
from hetgmp.experiments.predict import predict_fetches
from hetgmp.experiments.report import COMMON_COLUMNS, markdown_table, write_report
from hetgmp.experiments.sweep import (
    DEFAULT_STORE_RATES,
    SweepOptions,
    ensure_plan,
    run_sweep,
    with_repeats,
)
from hetgmp.experiments.table import RunTable, aggregate

METRICS = (
    "val_auc", "val_logloss", "bytes_per_sample", "bytes_per_sample_ids",
    "bytes_per_sample_versions", "bytes_per_sample_values", "bytes_per_sample_gradients",
    "mirror_hit", "samples_per_s", "table_mb_max", "peak_rss_mb_max", "remote_rows_per_step",
    "predicted_fetches_per_step",
)  # fmt: skip


def run_store_rate(
    opts: SweepOptions,
    *,
    store_rates: tuple[float, ...] = DEFAULT_STORE_RATES,
    bound: int = 100,
    plan: Path | None = None,
) -> tuple[list[str], Path]:
    """Run (or resume) the sweep and write CSV, PNG, markdown; returns (errors, csv path)."""
    plots.require()  # before the runs: their plots are made after them
    if any(not 0.0 <= s <= 1.0 for s in store_rates):
        raise ValueError(f"--store-rates must lie in [0, 1], got {list(store_rates)}")
    if bound < 0:
        raise ValueError(f"--bound must be >= 0, got {bound}")
    plan = plan or ensure_plan(
        opts.data, opts.workers, opts.out, batch_size=opts.batch_size, seed=opts.seed
    )
    pred = predict_fetches(opts.data, plan, batch_size=opts.batch_size, store_rates=store_rates)
    base = opts.base_spec("store_rate", plan=str(plan), method="plan", bound=bound)
    specs = with_repeats(
        [dataclasses.replace(base, store_rate=s) for s in store_rates], opts.repeats
    )
    table = RunTable(opts.out / "store_rate.csv")

    def add_prediction(spec, row) -> None:  # noqa: ANN001 - (RunSpec, Row)
        row["predicted_fetches_per_step"] = pred["with_mirrors"][spec.store_rate]

    errors = run_sweep(specs, table, opts.out / "runs", opts=opts, extra=add_prediction)
    write_outputs(table, opts, bound)
    return errors, table.path


def write_outputs(table: RunTable, opts: SweepOptions, bound: int) -> None:
    """PNG and markdown from the CSV (all runs in it, aggregated over repeats)."""
    rows = [r for r in table.rows if r.get("status") == "ok"]
    if not rows:
        return
    agg = aggregate(rows, ["ranks", "bound", "store_rate"], METRICS)
    where = opts.where
    plots.plot_store_rate(
        agg, opts.out / "store_rate.png", f"store-rate sweep ({where}, bound {bound})"
    )
    cols = (
        ("ranks", "ranks", "d"),
        ("bound", "bound", "d"),
        ("store_rate", "store rate", "g"),
        *COMMON_COLUMNS[:-1],
        ("remote_rows_per_step", "remote rows/step", ".0f"),
        ("predicted_fetches_per_step", "predicted", ".0f"),
        COMMON_COLUMNS[-1],
    )
    text = (
        f"Data `{opts.data}`, {where}, batch {opts.batch_size}/rank, {opts.iters} steps, "
        f"dim {opts.embed_dim}, {opts.model}, {opts.optimizers}, {opts.repeats} repeat(s). "
        "Predicted = "
        "the cost model's remote rows/step at this batch size with always-fresh mirrors."
    )
    write_report(
        opts.out / "store_rate.md",
        "store-rate sweep",
        text,
        markdown_table(agg, cols),
        "store_rate.png",
    )
