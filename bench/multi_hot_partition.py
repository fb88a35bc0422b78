"""Issue 34's partition figure: does the plan cut remote rows on multi-hot data at least as much
as on single-hot (vs hash, 4 parts)?

    .venv/bin/python bench/multi_hot_partition.py [--samples 200000] [--scale 0.01]
        [--multi-hot 2:20] [--communities 16] [--community-global 0.1] [--parts 4]
        [--batch-size 1024,8192] [--work /tmp/mh_partition]
        [--out bench/results/multi_hot_partition.md]

Generates two criteo-like sets with the same seed, samples and single-hot fields: one
single-hot only, one with ``--multi-hot K:L`` list fields more (a user's history drawn from
their interests, ``hetgmp.data.planted_multi_hot``; with ``--communities C`` > 0, the interests
come from the user's community's sub-catalogue, ``hetgmp.data.planted_communities``; 0 is the
first run's global law). Partitions each into ``--parts`` with
``metis+refine`` (``refine`` where pymetis does not import) and with ``hash``, and reports the
plans' expected remote rows per step (the batch-aware cost model, every id of every list
counted, no mirrors) and the ratio plan / hash. The figure holds when the multi-hot ratio is
at most the single-hot one. Writes a markdown table and a JSON file with machine, command and
date; exits 1 when the figure does not hold at some batch size.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_partition_quality import machine  # noqa: E402

from hetgmp.data.format import open_dataset  # noqa: E402
from hetgmp.data.generate import generate_criteo_like  # noqa: E402
from hetgmp.partition.api import partition_dataset, peak_rss_mb, train_rows  # noqa: E402
from hetgmp.partition.cost import samples_per_part, soft_count  # noqa: E402
from hetgmp.partition.quality import usage_counts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def plan_method() -> str:
    """METIS's start where pymetis imports, else the refinement alone."""
    try:
        import pymetis  # noqa: F401
    except ImportError:
        return "refine"
    return "metis+refine"


def one_set(name: str, root: Path, args: argparse.Namespace, multi_hot: str) -> list[dict]:
    """Generate (or reuse) one set, partition it both ways at every batch size: its rows."""
    if not (root / "meta.json").exists():
        generate_criteo_like(root, num_samples=args.samples, scale=args.scale, seed=args.seed,
                             multi_hot=multi_hot, communities=args.communities if multi_hot else 0,
                             community_global=args.community_global, progress=False,
                             log=lambda line: None)  # fmt: skip
    ds = open_dataset(root)
    tr = ds.train
    ids = tr.sparse.shape[1] * len(tr) + sum(int(mh.offsets[-1]) for mh in tr.multi_hot)
    out = []
    for batch in args.batch_size:
        row: dict[str, Any] = {
            "data": name, "multi_hot": multi_hot or "none", "train_samples": len(tr),
            "rows": ds.meta.num_embeddings, "ids_per_sample": ids / len(tr), "batch": batch,
        }  # fmt: skip
        for key, method in (("plan", args.method), ("hash", "hash")):
            row.update(measure(ds, key, method, batch, args))
        row["ratio"] = row["plan_fetches"] / row["hash_fetches"]
        hashed = row["hash_fetches_mirrors"]  # (0 where 1 % of the rows is all a worker uses)
        row["ratio_mirrors"] = row["plan_fetches_mirrors"] / hashed if hashed else float("nan")
        print(f"{name} batch {batch}: plan {row['plan_fetches']:.0f} / hash "
              f"{row['hash_fetches']:.0f} rows/step = {row['ratio']:.3f}", flush=True)  # fmt: skip
        out.append(row)
    return out


def measure(
    ds: Any, key: str, method: str, batch: int, args: argparse.Namespace
) -> dict[str, float]:
    """One plan's figures, keyed ``{key}_...``; with lists, where its remote rows lie."""
    t0 = time.perf_counter()
    plan = partition_dataset(ds, args.parts, method=method, batch_size=batch, seed=args.seed,
                             report_baselines=False, progress=False)  # fmt: skip
    q = plan.meta["quality"]
    out = {
        "fetches": float(q["fetches_per_step"]),
        "seconds": time.perf_counter() - t0,
        "samples_spread": q["max_over_mean"]["samples"],
        "fetches_mirrors": float(q["fetches_per_step_with_store_rate"]["0.01"]),
    }
    if ds.meta.multi_hot:
        out.update(where_remote(ds, plan, batch))
    return {f"{key}_{k}": v for k, v in out.items()}


def where_remote(ds: Any, plan: Any, batch: int) -> dict[str, float]:
    """The plan's remote rows per step on the single-hot fields' rows and on the lists' rows,
    and the share of the latter on rows that every part's samples use (no placement makes
    those local to all: only mirrors save them)."""
    counts = np.asarray(usage_counts(train_rows(ds), plan.data_partition, plan.nparts,
                                     plan.num_rows), dtype=np.int64)  # fmt: skip
    m = samples_per_part(plan.num_samples, plan.nparts)
    remote = soft_count(counts, m, batch) * (
        plan.embed_partition[:, None] != np.arange(plan.nparts)[None, :]
    )
    per_row = remote.sum(axis=1)
    lists = ds.meta.multi_hot[0].offset  # (the lists' rows follow the single-hot fields')
    everywhere = (counts[lists:] > 0).all(axis=1)
    on_lists = float(per_row[lists:].sum())
    return {
        "remote_single_fields": float(per_row[:lists].sum()),
        "remote_lists": on_lists,
        "lists_share_used_by_all_parts": float(per_row[lists:][everywhere].sum()) / on_lists
        if on_lists
        else 0.0,
    }


def lists_options(args: argparse.Namespace) -> str:
    """The multi-hot set's community options as typed (none for the global law)."""
    if not args.communities:
        return ""
    return f" --communities {args.communities} --community-global {args.community_global}"


def lists_words(args: argparse.Namespace) -> str:
    """What the lists are drawn from, in words."""
    if not args.communities:
        return "lists drawn from the user's interests, from the catalogue's global power law"
    return (
        f"lists drawn from the user's interests, from their community's power law over its own "
        f"slice of the catalogue, {args.community_global:.0%} of draws from the global law"
    )


def holds(rows: list[dict[str, Any]], batch: int) -> tuple[bool, float, float]:
    """(the figure holds at ``batch``, single-hot ratio, multi-hot ratio)."""
    single, multi = (r["ratio"] for r in rows if r["batch"] == batch)
    return multi <= single, single, multi


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace, head: dict[str, Any]) -> str:
    lines = [
        f"# Partition on multi-hot vs single-hot data: remote rows per step, {args.parts} parts",
        "",
        f"- machine: {head['machine']}",
        f"- command: `{head['command']}`",
        f"- date: {head['date']}",
        f"- peak RSS: {head['peak_rss_mb']:.0f} MiB",
        f"- sets: criteo-like, {args.samples} samples (90 % train), scale {args.scale}, seed "
        f"{args.seed}, the same 26 single-hot fields; the multi-hot set adds `--multi-hot "
        f"{args.multi_hot}{lists_options(args)}` ({lists_words(args)}, locality 0.8)",
        "- cost: sum over workers of expected remote rows per step (the batch-aware soft count "
        "at the per-worker batch, every id of every list, repeats weighing), no mirrors "
        "(and with each worker mirroring its best 1 % of the rows, the plan's mirror ranking); "
        f"plan = `{args.method}` made for that batch, hash = `--method hash`",
        "",
        "| batch | data | ids/sample | rows | plan rows/step | hash rows/step | plan / hash | "
        "rows/step saved | plan / hash, 1 % mirrors each | max/mean samples | plan s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['data']} | {r['ids_per_sample']:.1f} | {r['rows']} | "
            f"{r['plan_fetches']:.0f} | {r['hash_fetches']:.0f} | {r['ratio']:.3f} | "
            f"{r['hash_fetches'] - r['plan_fetches']:.0f} | {r['ratio_mirrors']:.3f} | "
            f"{r['plan_samples_spread']:.3f} | "
            f"{r['plan_seconds']:.1f} |"
        )
    lines += [
        "",
        "Where the multi-hot set's remote rows lie (rows/step, plan vs hash): the single-hot "
        "fields' rows, the lists' rows, and the share of the lists' remote rows on rows that "
        "samples of every part use (no placement makes those local: only mirrors save them).",
        "",
        "| batch | single-hot fields plan / hash | lists plan / hash | lists' share on rows "
        "every part uses, plan / hash |",
        "|---|---|---|---|",
    ]
    for r in rows:
        if r["data"] == "multi-hot":
            lines.append(
                f"| {r['batch']} | {r['plan_remote_single_fields']:.0f} / "
                f"{r['hash_remote_single_fields']:.0f} | {r['plan_remote_lists']:.0f} / "
                f"{r['hash_remote_lists']:.0f} | {r['plan_lists_share_used_by_all_parts']:.3f} / "
                f"{r['hash_lists_share_used_by_all_parts']:.3f} |"
            )
    lines.append("")
    for batch in args.batch_size:
        ok, single, multi = holds(rows, batch)
        lines.append(
            f"- batch {batch}: the figure {'holds' if ok else 'DOES NOT hold'}: plan / hash "
            f"{multi:.3f} on multi-hot vs {single:.3f} on single-hot"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=200_000)
    p.add_argument("--scale", type=float, default=0.01)
    p.add_argument("--multi-hot", default="2:20")
    p.add_argument("--communities", type=int, default=16,
                   help="the multi-hot set's --communities (0: the global law)")  # fmt: skip
    p.add_argument("--community-global", type=float, default=0.1)
    p.add_argument("--parts", type=int, default=4)
    p.add_argument("--batch-size", type=lambda v: [int(b) for b in v.split(",")],
                   default=[1024, 8192], help="per-worker batch sizes, comma-separated")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--method", default=plan_method(), help="default: metis+refine or refine")
    p.add_argument("--work", type=Path, default=Path("/tmp/mh_partition"))
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/multi_hot_partition.md")
    args = p.parse_args(argv)
    tag = f"{args.samples}_{args.scale}_{args.seed}"
    single = one_set("single-hot", args.work / f"single_{tag}", args, "")
    lists = f"{args.multi_hot}_c{args.communities}_g{args.community_global}"
    multi = one_set("multi-hot", args.work / f"multi_{tag}_{lists}", args, args.multi_hot)
    rows = [r for pair in zip(single, multi, strict=True) for r in pair]
    head = {
        "machine": machine(),
        "command": "python bench/multi_hot_partition.py " + " ".join(sys.argv[1:] or []),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "peak_rss_mb": peak_rss_mb(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(rows, args, head))
    args.out.with_suffix(".json").write_text(json.dumps({**head, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(holds(rows, b)[0] for b in args.batch_size) else 1


if __name__ == "__main__":
    sys.exit(main())
