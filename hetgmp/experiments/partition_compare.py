"""Partition comparison: methods x part counts, predicted cost next to measured communication.

For each method (``hash``, ``random``, ``refine``, ``metis``, ``metis+refine``) and part count,
makes a plan **at the run's batch size**, trains at store rate 0 and bound 0 (so every non-owned
row is fetched every step it is used, which is exactly what the cost model counts) and records
the plan's predicted remote rows per step next to the runtime's measured ``rows_remote`` per step,
plus measured bytes per sample and the predicted bytes (fetches x :func:`bytes_per_fetch` / batch).
Outputs in ``--out``: ``partition.csv``, ``partition.png``, ``partition.md``.
"""

from __future__ import annotations

from pathlib import Path

from hetgmp.experiments import plots
from hetgmp.experiments.launch import RunSpec
from hetgmp.experiments.predict import bytes_per_fetch, plan_prediction, predict_fetches
from hetgmp.experiments.report import markdown_table, write_report
from hetgmp.experiments.sweep import (
    DEFAULT_PARTS,
    SweepOptions,
    ensure_plan,
    run_sweep,
    with_repeats,
)
from hetgmp.experiments.table import Row, RunTable, aggregate
from hetgmp.models import model_class
from hetgmp.partition.api import METHODS

PARTITION_DEFAULT_BATCH = 8192  # `hetgmp partition --batch-size` default
METRICS = (
    "predicted_fetches_per_step", "predicted_fetches_per_step_actual_m", "remote_rows_per_step",
    "measured_over_predicted", "plan_fetches_per_step", "predicted_at_default_batch", "predicted_bytes_per_sample",
    "bytes_per_sample", "val_auc", "samples_per_s", "plan_seconds",
)  # fmt: skip


def run_partition_compare(
    opts: SweepOptions,
    *,
    methods: tuple[str, ...] = METHODS,
    parts: tuple[int, ...] = DEFAULT_PARTS,
) -> tuple[list[str], Path]:
    """Run (or resume) the comparison and write CSV, PNG, markdown; returns (errors, csv path)."""
    plots.require()  # before the runs: their plots are made after them
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"--methods: unknown {bad}; choose from {list(METHODS)}")
    if opts.gpus:
        raise ValueError("the partition comparison runs on CPU ranks (--parts); drop --gpus")
    specs: list[RunSpec] = []
    for p in parts:
        if p < 1:
            raise ValueError(f"--parts must be >= 1, got {p}")
        for m in methods:
            plan = ensure_plan(
                opts.data, p, opts.out, method=m, batch_size=opts.batch_size, seed=opts.seed
            )
            specs.append(opts.base_spec("partition", ranks=p, plan=str(plan), method=m))
    specs = with_repeats(specs, opts.repeats)
    table = RunTable(opts.out / "partition.csv")
    table_dim = model_class(opts.model).table_dim(opts.embed_dim)
    state = 1 if opts.optimizer == "adagrad" else 0

    def add_prediction(spec: RunSpec, row: Row) -> None:
        pred = predict_fetches(spec.dataset, spec.plan, batch_size=spec.batch_size)
        row.update(plan_prediction(spec.plan))
        row["predicted_fetches_per_step"] = pred["fetches_per_step"]
        row["predicted_fetches_per_step_actual_m"] = pred["fetches_per_step_actual_m"]
        # What a plan made with `hetgmp partition`'s default --batch-size would have reported.
        row["predicted_at_default_batch"] = predict_fetches(
            spec.dataset, spec.plan, batch_size=PARTITION_DEFAULT_BATCH
        )["fetches_per_step"]
        measured = float(row["remote_rows_per_step"])
        row["measured_over_predicted"] = (
            measured / pred["fetches_per_step"] if pred["fetches_per_step"] else None
        )
        global_batch = spec.batch_size * spec.ranks
        row["predicted_bytes_per_sample"] = (
            pred["fetches_per_step"] * bytes_per_fetch(table_dim, state) / global_batch
        )

    errors = run_sweep(specs, table, opts.out / "runs", opts=opts, extra=add_prediction)
    write_outputs(table, opts)
    return errors, table.path


def write_outputs(table: RunTable, opts: SweepOptions) -> None:
    """PNG and markdown from the CSV (all runs in it, aggregated over repeats)."""
    rows = [r for r in table.rows if r.get("status") == "ok"]
    if not rows:
        return
    agg = aggregate(rows, ["ranks", "method"], METRICS)
    plots.plot_partition(
        agg,
        opts.out / "partition.png",
        f"partition methods ({Path(opts.data).name}, batch {opts.batch_size})",
    )
    cols = (
        ("ranks", "parts", "d"), ("method", "method", "s"),
        ("predicted_fetches_per_step", "predicted rows/step", ".1f"),
        ("remote_rows_per_step", "measured rows/step", ".1f"),
        ("measured_over_predicted", "measured/predicted", ".3f"),
        ("predicted_fetches_per_step_actual_m", "predicted (real M)", ".1f"),
        ("predicted_at_default_batch", f"predicted at batch {PARTITION_DEFAULT_BATCH}", ".0f"),
        ("predicted_bytes_per_sample", "predicted bytes/sample", ".1f"),
        ("bytes_per_sample", "measured bytes/sample", ".1f"),
        ("val_auc", "AUC", ".4f"), ("samples_per_s", "samples/s", ".0f"),
        ("plan_seconds", "plan s", ".1f"), ("runs", "runs", "d"),
    )  # fmt: skip
    text = (
        f"Data `{opts.data}`, plans made at the run's batch size ({opts.batch_size}/rank), "
        f"store rate 0, bound 0, {opts.iters} steps, dim {opts.embed_dim}, {opts.model}, "
        f"{opts.optimizers}. "
        "Rows/step are remote rows fetched per global step, summed over workers."
    )
    write_report(
        opts.out / "partition.md",
        "partition comparison",
        text,
        markdown_table(agg, cols),
        "partition.png",
    )
