"""``hetgmp partition``: make a plan; ``hetgmp partition verify|stats``: inspect one.

hetgmp partition -n 8 -o part.npz [--data DIR] [--method metis+refine] ...
hetgmp partition verify part.npz --data DIR
hetgmp partition stats part.npz
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from hetgmp.config import add_arguments, from_namespace, option, to_dict
from hetgmp.config_file import add_config_option
from hetgmp.partition import baselines, cost
from hetgmp.partition.api import DEFAULT_ROUNDS, DEFAULT_THETA, METHODS
from hetgmp.partition.metis_start import DEFAULT_METIS_MAX_EDGES
from hetgmp.partition.plan import Plan, PlanError, load_plan, save_plan
from hetgmp.progress import log_above_bars

log = logging.getLogger("hetgmp.partition")


@dataclasses.dataclass
class PartitionConfig:
    """Options of ``hetgmp partition`` / ``partition/partition.py``."""

    nparts: int = option(
        8,
        help="number of workers (parts); --parts, --np, --ranks and HET-GMP's --nrank too",
        flags=["-n", "--nparts", "--parts", "--np", "--ranks", "--nrank"],
        check=lambda v: v >= 1,
        check_msg="must be >= 1",
    )
    out: Path = option(Path("part.npz"), help="plan file to write", flags=["-o", "--out"])
    data: Path | None = option(
        None, help="dataset directory (default: a generated criteo-like set, cached)"
    )
    method: str = option("metis+refine", help="partitioning method", choices=METHODS)
    batch_size: int = option(
        8192,
        help="per-worker batch size of the cost model",
        check=lambda v: v >= 1,
        check_msg="must be >= 1",
        flags=["--batch-size", "--batch_size", "-b"],
    )
    rounds: int = option(
        DEFAULT_ROUNDS,
        help="refinement rounds (sample pass + row pass); HET-GMP's --rerun too",
        check=lambda v: v >= 0,
        check_msg="must be >= 0",
        flags=["--rounds", "--rerun", "-r"],
    )
    seed: int = option(
        0,
        help="random seed (same seed, input and --threads -> identical plan arrays; the file's "
        "meta also records timings, so its bytes differ)",
    )
    threads: int | None = option(None, help="OpenMP threads (default: all cores)")
    intra_cost: float = option(
        cost.DEFAULT_INTRA_COST,
        help="cost of a fetch between GPUs of one node (across nodes = 1)",
        check=lambda v: 0.0 <= v <= 1.0,
        check_msg="must lie in [0, 1]",
        flags=["--intra-cost", "--intra_cost"],
    )
    gpus_per_node: int | None = option(
        None, help="workers per node (default: every worker is its own node); HET-GMP's "
        "--ngpus / -g too",
        flags=["--gpus-per-node", "--gpus_per_node", "--ngpus", "-g"],
    )  # fmt: skip
    max_mirror_rate: float = option(
        baselines.DEFAULT_MAX_MIRROR_RATE,
        help="longest mirror list, as a share of all rows",
        check=lambda v: 0.0 <= v <= 1.0,
        check_msg="must lie in [0, 1]",
        flags=["--max-mirror-rate", "--max_mirror_rate"],
    )
    theta: float = option(DEFAULT_THETA, help="weight of the owner-serving-load balance term")
    metis_max_edges: int = option(
        DEFAULT_METIS_MAX_EDGES,
        help="largest graph given to METIS; above it, a sampled graph",
        check=lambda v: v >= 1,
        check_msg="must be >= 1",
    )
    progress: bool = option(True, help="progress bars (only on a terminal)")


def default_dataset():
    """The embedded default data set (shared with ``hetgmp train``), generated on first use."""
    from hetgmp.data.defaults import default_dataset_dir, ensure_default_dataset

    if not (default_dataset_dir() / "meta.json").exists():
        log.info("partition: generating the default data set into %s", default_dataset_dir())
    return ensure_default_dataset()


def run_partition(cfg: PartitionConfig) -> Plan:
    """Partition ``cfg.data`` (or the default data set) and write the plan to ``cfg.out``."""
    from hetgmp.data.format import open_dataset
    from hetgmp.data.id_ranges import check_id_ranges
    from hetgmp.partition.api import partition_dataset

    ds = open_dataset(cfg.data) if cfg.data is not None else default_dataset()
    # (before the graph is built from the ids; multi-hot lists are partitioned, so checked)
    check_id_ranges(ds, ds.meta.num_embeddings, "partitioning", multi_hot_ok=True)
    n = ds.meta.splits.get("train", len(ds.train))
    if cfg.nparts > n:
        raise PlanError(f"-n {cfg.nparts} is larger than the {n} training samples of {ds.root}")
    plan = partition_dataset(
        ds,
        cfg.nparts,
        method=cfg.method,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        threads=cfg.threads,
        rounds=cfg.rounds,
        intra_cost=cfg.intra_cost,
        gpus_per_node=cfg.gpus_per_node,
        max_mirror_rate=cfg.max_mirror_rate,
        theta=cfg.theta,
        metis_max_edges=cfg.metis_max_edges,
        progress=cfg.progress,
    )
    # the resolved options, as train's results file has them (``partition stats --json`` shows
    # them, and that output loads back through ``--config``)
    plan.meta["config"] = to_dict(cfg)
    save_plan(plan, cfg.out)
    return plan


def format_report(plan: Plan) -> str:
    """Human-readable quality report of a plan (from its ``meta``)."""
    q = plan.meta.get("quality")
    lines = [
        f"plan: {plan.nparts} parts, {plan.num_samples} samples, {plan.num_rows} rows, "
        f"method {plan.meta.get('method', '?')}, batch {plan.meta.get('batch_size', '?')}"
    ]
    if not q:
        lines.append("(no quality report stored; run `hetgmp partition verify PLAN --data DIR`)")
        return "\n".join(lines)
    rates = list(q["fetches_per_step_with_store_rate"])
    head = f"{'worker':>6} {'samples':>10} {'rows':>10} {'fetches':>10} " + " ".join(
        f"{'st' + r:>10}" for r in rates
    )
    lines.append(head)
    for w, e in enumerate(q["workers"]):
        lines.append(
            f"{w:>6} {e['samples']:>10} {e['rows']:>10} {e['fetches']:>10.1f} "
            + " ".join(f"{e['fetches_store_' + r]:>10.1f}" for r in rates)
        )
    lines.append(_total_line("total", q))
    for name, rep in q.get("baselines", {}).items():
        lines.append(_total_line(name, rep))
    timing = plan.meta.get("timing")
    if timing:
        lines.append("timing: " + " ".join(f"{k}={v:.1f}" for k, v in timing.items()))
    return "\n".join(lines)


def _total_line(name: str, q: dict[str, Any]) -> str:
    s = q["fetches_per_step_with_store_rate"]
    b = q["max_over_mean"]
    return (
        f"{name}: fetches/step {q['fetches_per_step']:.1f}, weighted {q['weighted_cost_per_step']:.1f}; "
        + ", ".join(f"store {k}: {v:.1f}" for k, v in s.items())
        + f"; max/mean samples {b['samples']:.3f} rows {b['rows']:.3f} serves {b['serves']:.3f}"
    )


def verify_plan(plan_path: Path, data: Path, threads: int | None = None) -> dict[str, Any]:
    """Check a plan against a data set and recompute its quality report; raise PlanError."""
    from hetgmp.data.format import open_dataset
    from hetgmp.partition.api import train_rows
    from hetgmp.partition.quality import quality_report

    plan = load_plan(plan_path)
    ds = open_dataset(data)
    plan.check_matches(
        num_samples=len(ds.train),
        num_rows=ds.meta.num_embeddings,
        fingerprint=ds.fingerprint,
        where=str(plan_path),
    )
    batch = int(plan.meta.get("batch_size", 8192))
    topo = np.asarray(plan.meta.get("cost_matrix", cost.topology_matrix(plan.nparts)))
    empty = [w for w in range(plan.nparts) if not np.any(plan.data_partition == w)]
    if empty:
        raise PlanError(f"{plan_path}: workers {empty} have no training samples")
    for w, mir in enumerate(plan.mirrors):
        if mir.size and np.any(plan.embed_partition[mir] == w):
            raise PlanError(f"{plan_path}: mirror list {w} holds rows that worker {w} owns")
    return quality_report(
        train_rows(ds),
        plan.data_partition,
        plan.embed_partition,
        plan.nparts,
        batch_size=batch,
        topo=topo,
        num_rows=plan.num_rows,
        threads=int(threads or 0),
    )


def _cmd_partition(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = from_namespace(PartitionConfig, args)
    with log_above_bars():  # (stage lines while a bar is drawn)
        plan = run_partition(cfg)
    print(format_report(plan))
    print(f"wrote {cfg.out}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    report = verify_plan(args.plan, args.verify_data, args.threads)
    plan = load_plan(args.plan)
    plan.meta["quality"] = {
        **report,
        "baselines": plan.meta.get("quality", {}).get("baselines", {}),
    }
    print(format_report(plan))
    print(f"{args.plan}: OK, matches {args.verify_data}")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    if args.json:
        print(json.dumps(plan.meta, indent=2, sort_keys=True))
    else:
        print(format_report(plan))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``partition`` (with ``verify`` and ``stats``) to ``hetgmp``."""
    p = sub.add_parser("partition", help="partition samples and embedding rows across workers")
    add_parser_options(p)


def add_parser_options(p: argparse.ArgumentParser) -> None:
    """The options of ``hetgmp partition`` and its ``verify`` / ``stats`` subcommands."""
    add_config_option(p)
    add_arguments(p, PartitionConfig)
    p.set_defaults(func=_cmd_partition)
    actions = p.add_subparsers(dest="partition_command", metavar="{verify,stats}")
    v = actions.add_parser("verify", help="check a plan against a data set and print its report")
    v.add_argument("plan", type=Path, help="plan file (part.npz)")
    v.add_argument(
        "--data",
        dest="verify_data",
        type=Path,
        required=True,
        help="dataset directory the plan was made for",
    )
    v.add_argument(
        "--threads", dest="threads", type=int, default=None,
        help="OpenMP threads of the recomputed report (default: all cores)",
    )  # fmt: skip
    v.set_defaults(func=_cmd_verify)
    s = actions.add_parser("stats", help="print the quality report stored in a plan")
    s.add_argument("plan", type=Path, help="plan file (part.npz)")
    s.add_argument("--json", action="store_true", help="print the whole meta as JSON")
    s.set_defaults(func=_cmd_stats)
