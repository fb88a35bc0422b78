#!/usr/bin/env python
"""Report of ``bench/gpu/host_tier.sh``: the table all on the device against rows in host
memory with a device cache (issue 33), from the runs' ``--output`` JSON files.

    python bench/gpu/host_tier_report.py RES_DIR --command "..."   # writes RES_DIR/summary.md

A run is ``RES_DIR/<name>.json`` (``device``, ``device-nographs``, ``tier-<budget>``,
``dtier-<budget>`` (the tier decided on the device), ``big``)
with its log ``<name>.log``; ``env.txt`` holds the machine's lines (GPU, memory, the big run's
scale). A run that left no JSON is listed with the last line of its log.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

ORDER = ("device", "device-nographs")  # then tier-* by descending budget, then big


def load(res: Path) -> list[tuple[str, dict[str, Any] | None]]:
    """The runs' records in report order (None: no JSON)."""
    names = {p.stem for p in res.glob("*.log")} | {p.stem for p in res.glob("*.json")}
    tiers = sorted(
        (n for n in names if n.startswith(("tier-", "dtier-"))),
        key=lambda n: (-float(n.split("-", 1)[1]), n.startswith("d")),
    )  # (by descending budget; at one budget the device-decided tier after the host's)
    order = [n for n in ORDER if n in names] + tiers
    order += [n for n in ("big", "big-2dev") if n in names]
    out = []
    for name in order:
        p = res / f"{name}.json"
        out.append((name, json.loads(p.read_text()) if p.exists() else None))
    return out


def row(name: str, rec: dict[str, Any] | None, base: float | None, res: Path) -> str:
    """One markdown table row."""
    if rec is None:
        log = res / f"{name}.log"
        lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
        why = (lines[-1] if lines else "no log")[:120].replace("|", "/")
        return f"| {name} | failed: {why} |" + " |" * 10
    t = rec.get("host_tier") or {}
    rows = t.get("table_rows") or rec.get("memory", {}).get("stored_rows_max", 0)
    budget = f"{t['cache_rows'] / t['table_rows']:.0%}" if t else "all"
    speed = float(rec.get("speed") or 0.0)
    ratio = f"{speed / base:.2f}x" if base else "-"
    hit = f"{t['hit_rate']:.3f}" if t else "-"
    h2d = f"{t['bytes_h2d_per_step'] / 2**10:,.1f}" if t else "0"
    d2h = f"{t['bytes_d2h_per_step'] / 2**10:,.1f}" if t else "0"
    host = f"{t['host_bytes'] / 2**20:,.1f}" if t else "0"
    auc = rec.get("val_auc")
    auc_s = f"{auc:.4f}" if isinstance(auc, float) else "-"
    graph = str(rec.get("step_graph", "-"))[:48].replace("|", "/")
    return (
        f"| {name} | {int(rows):,} | {budget} | {speed:,.0f} | {ratio} | {hit} | {h2d} | "
        f"{d2h} | {host} | {auc_s} | {rec.get('step', '-')} | {graph} |"
    )


def report(res: Path, command: str) -> str:
    runs = load(res)
    recs = dict(runs)
    base_rec = recs.get("device")
    base = float(base_rec["speed"]) if base_rec and base_rec.get("speed") else None
    first = next((r for _, r in runs if r is not None), {}) or {}
    env = (res / "env.txt").read_text().strip() if (res / "env.txt").exists() else ""
    lines = [
        "# Rows in host memory with a device cache (bench/gpu/host_tier.sh, issue 33)",
        "",
        f"- machine: {first.get('machine', '?')}, torch {first.get('torch', '?')}",
        *(f"- {ln}" for ln in env.splitlines()),
        f"- command: `{command}`",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        "- every run: the same model, data and steps; `x device`: samples/s over the all-on-"
        "device run's (CUDA graphs on; the tier runs without, `device-nographs` shows that "
        "part); H2D / D2H: KiB per training step between host memory and the cache; host MiB: "
        "rows + optimizer state in host memory; `big`: rows + state >= the factor x the GPU's "
        "memory (env above), against the `device` run's smaller table of the same distribution; "
        "`big-2dev`: the big set all on the devices of 2 GPUs at bound 0 (the same global batch "
        "and steps: the AUC the tier must match on one data set; its `x device` compares 2 GPUs)",
        "",
        "| run | table rows | cache | samples/s | x device | hit rate | H2D KiB/step | "
        "D2H KiB/step | host MiB | val AUC | steps | step graph |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(row(n, r, base, res) for n, r in runs),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("res", type=Path)
    ap.add_argument("--command", default="bash bench/gpu/host_tier.sh")
    args = ap.parse_args(argv)
    text = report(args.res, args.command)
    (args.res / "summary.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
