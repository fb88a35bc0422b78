"""Merge the per-launch results into ``results.json`` and a markdown table (``results.md``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EMB_PHASES = ("preprocess", "exchange", "lookup", "backward", "update", "embedding")
TRAIN_PHASES = ("preprocess", "exchange", "lookup", "mlp", "dense_sync", "update", "embedding")


def load_runs(out: Path) -> list[dict[str, Any]]:
    """Every launch's ``{"machine", "command", "results"}``; a crashed launch's partial JSONL too."""
    runs = []
    for w in sorted({p.stem.split("_w")[-1] for p in out.glob("*_w*.json*")}, key=str):
        full = out / f"results_w{w}.json"
        raw = out / f"raw_w{w}.jsonl"
        if full.exists():
            runs.append(json.loads(full.read_text()))
        elif raw.exists():
            recs = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
            if recs:
                runs.append(
                    {
                        "machine": recs[0].get("machine", {}),
                        "command": "(launch did not finish: partial results)",
                        "results": [{k: v for k, v in r.items() if k != "machine"} for r in recs],
                        "partial": True,
                    }
                )
    return runs


def _f(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def _phases(rec: dict[str, Any], names: tuple[str, ...]) -> str:
    ph = rec.get("phases_ms", {})
    return " / ".join(_f(ph.get(p), 2) if p in ph else "-" for p in names)


def _present(recs: list[dict[str, Any]], names: tuple[str, ...]) -> tuple[str, ...]:
    """The phases of ``names`` that some record measured (in ``names`` order)."""
    seen = {p for r in recs for p in r.get("phases_ms", {})}
    return tuple(p for p in names if p in seen) + tuple(sorted(seen - set(names)))


def _find(recs: list[dict[str, Any]], **kw: Any) -> dict[str, Any] | None:
    for r in recs:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def headline(recs: list[dict[str, Any]]) -> list[str]:
    """The issue's target ratios, where both sides were measured (embedding step, then training)."""
    out = []
    keys = sorted(
        {
            (r["mode"], r.get("model") or "", r.get("precision") or "", r["batch_per_gpu"])
            for r in recs
        }
    )
    for mode, model, prec, b in keys:
        grp = [
            r
            for r in recs
            if (r["mode"], r.get("model") or "", r.get("precision") or "", r["batch_per_gpu"])
            == (mode, model, prec, b)
        ]
        torch1 = _find(grp, contender="torch", world=1)
        het1 = _find(grp, contender="hetgmp", world=1)
        pairs = [("hetgmp 1 GPU / torch 1 GPU", het1, torch1)]
        for name in ("hetgmp-b100", "hetgmp-b100-all", "hetgmp-b100-pad"):
            het2 = _find(grp, contender=name, world=2)
            pairs += [
                (f"{name} 2 GPUs / hetgmp 1 GPU", het2, het1),
                (f"{name} 2 GPUs / torch 1 GPU", het2, torch1),
                (f"{name} 2 GPUs / rowwise 2 GPUs", het2, _find(grp, contender="rowwise", world=2)),
                (
                    f"{name} 2 GPUs / tablewise 2 GPUs",
                    het2,
                    _find(grp, contender="tablewise", world=2),
                ),
            ]
        what = "embedding step" if mode == "embedding" else f"{model} {prec}"
        for label, a, c in pairs:
            if a and c:
                out.append(
                    f"- {what}, B={b}/GPU: {label} = "
                    f"**{a['samples_per_s'] / c['samples_per_s']:.2f}x** "
                    f"({a['samples_per_s'] / 1e6:.2f}M vs {c['samples_per_s'] / 1e6:.2f}M samples/s)"
                )
    return out


def markdown(runs: list[dict[str, Any]], workload: dict[str, Any] | None) -> str:
    """``results.md``: how it was measured, the machines and data, headline ratios, then the
    embedding-step and training-step tables."""
    recs = [r for run in runs for r in run["results"]]
    lines = ["# GPU benchmark: embedding step and WDL training vs baselines (issue 7)", ""]
    lines += ["Written by `bench/gpu/run.sh` (`bench/gpu/cli.py`). Samples/s are global (all GPUs), "
              "from the median over timed steps of the slowest rank's step; ms columns are a "
              "separate profiled pass (CUDA events, per rank, averaged over ranks); bytes/sample "
              "is what ranks send to other ranks (ids, versions, values, gradients; the small size "
              "exchanges are not counted), per global sample.", ""]  # fmt: skip
    lines += _run_lines(runs)
    if workload:
        lines += _workload_lines(workload)
    hl = headline(recs)
    if hl:
        lines += ["", "## Headline", "", *hl]
    emb = [r for r in recs if r["mode"] == "embedding"]
    if emb:
        lines += _embedding_section(emb) + _floor_lines(emb)
    tr = [r for r in recs if r["mode"] == "train"]
    if tr:
        lines += _train_section(tr)
    return "\n".join(lines) + "\n"


def _run_lines(runs: list[dict[str, Any]]) -> list[str]:
    """One bullet per launch: its machine, then its command."""
    lines = []
    for run in runs:
        m = run.get("machine", {})
        lines.append(
            f"- **{m.get('world_size', '?')} rank(s)**: {m.get('gpu') or m.get('device')}"
            f" x{m.get('world_size', '?')}, torch {m.get('torch')}, CUDA {m.get('cuda')}, "
            f"NCCL {m.get('nccl', '-')}, backend {m.get('backend')}, copy bandwidth "
            f"{m.get('copy_bandwidth_gbs')} GB/s, {m.get('date')}"
            + (
                " **(partial: the launch was cut by the time limit or failed)**"
                if run.get("partial")
                else ""
            )
        )
        lines.append(f"  - command: `{run.get('command', '')}`")
    return lines


def _workload_lines(workload: dict[str, Any]) -> list[str]:
    """The data's shape and, where there is one, the partition plan's cost and quality."""
    spec = workload.get("spec", {})
    lines = [
        f"- data: {spec.get('num_samples'):,} samples x {workload.get('num_fields')} fields, "
        f"{workload.get('num_rows'):,} rows, ids {workload.get('id_law')}; generated in "
        f"{workload.get('generate_s', 0):.1f} s"
    ]
    p = workload.get("partition")
    if p:
        base = ", ".join(f"{k} {v:,.0f}" for k, v in (p.get("baselines") or {}).items())
        lines.append(
            f"- plan: {p['method']} ({p['rounds']} rounds) for {spec.get('world_size')} parts "
            f"in **{p['wall_s']:.1f} s** (not counted in samples/s); expected remote fetches "
            f"per step {p.get('fetches_per_step') or 0:,.0f}" + (f" ({base})" if base else "")
            + f"; samples per worker {p.get('samples_per_worker')}"
        )  # fmt: skip
    return lines


def _embedding_section(emb: list[dict[str, Any]]) -> list[str]:
    """The embedding-step table, by batch then world size."""
    cols = _present(emb, EMB_PHASES)
    lines = [
        "", "## Embedding step alone (lookup + exchange + update, fixed random gradient)", "",
        "| GPUs | contender | batch/GPU | M samples/s | ms/step | ms: " + " / ".join(cols)
        + " | bytes/sample | peak GiB | % of HBM floor | rows owned/mirror/remote |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in sorted(emb, key=lambda r: (r["batch_per_gpu"], r["world"])):
        rs = r.get("rows_share")
        share = (
            f"{rs['owned']:.2f}/{rs['mirror_fresh'] + rs['mirror_stale_ok']:.2f}/{rs['remote']:.2f}"
            if rs else "-"
        )  # fmt: skip
        lines.append(
            f"| {r['world']} | {r['contender']} | {r['batch_per_gpu']} | "
            f"{r['samples_per_s'] / 1e6:.2f} | {_f(r['step_ms_median'])} | "
            f"{_phases(r, cols)} | {_f(r['bytes_per_sample'], 0)} | "
            f"{_f(r.get('peak_mem_gib'))} | {_f(r.get('pct_of_floor'), 1)} | {share} |"
        )
    return lines


def _floor_lines(emb: list[dict[str, Any]]) -> list[str]:
    """The HBM floor per (world size, batch), where the records carry one."""
    floors = {}
    for r in emb:
        fl = r.get("floor")
        if fl:
            floors[(r["world"], r["batch_per_gpu"])] = fl
    if not floors:
        return []
    lines = ["", "HBM floor of the embedding step (per GPU: write the [B, F, D] output, "
             "read its gradient, read the touched rows and read+write them in the update; "
             "divided by the measured copy bandwidth):", ""]  # fmt: skip
    for (w, b), fl in sorted(floors.items()):
        lines.append(
            f"- {w} GPU(s), B={b}: {fl['unique_rows_per_gpu_batch']:,.0f} unique rows per "
            f"batch, {fl['hbm_bytes_per_gpu_step'] / 1e6:,.1f} MB/step at "
            f"{fl['copy_bandwidth_gbs']:,.0f} GB/s = {fl['step_ms']:.3f} ms, i.e. "
            f"{fl['samples_per_s'] / 1e6:,.1f}M samples/s"
        )
    return lines


def _train_section(tr: list[dict[str, Any]]) -> list[str]:
    """The training-step table, by model, precision, batch, then world size."""
    cols = _present(tr, TRAIN_PHASES)
    lines = [
        "", "## Full training step (model + embedding, SGD)", "",
        "| GPUs | contender | model | precision | batch/GPU | M samples/s | ms/step | ms: "
        + " / ".join(cols) + " | bytes/sample | peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in sorted(tr, key=lambda r: (r["model"], r["precision"], r["batch_per_gpu"], r["world"])):
        lines.append(
            f"| {r['world']} | {r['contender']} | {r['model']} | {r['precision']} | "
            f"{r['batch_per_gpu']} | {r['samples_per_s'] / 1e6:.2f} | {_f(r['step_ms_median'])} | "
            f"{_phases(r, cols)} | {_f(r['bytes_per_sample'], 0)} | "
            f"{_f(r.get('peak_mem_gib'))} |"
        )
    return lines


def short_table(runs: list[dict[str, Any]]) -> str:
    """The few lines run.sh prints last."""
    rows = ["GPUs  contender     mode       model prec  batch    M samples/s   ms/step  B/sample"]
    for run in runs:
        for r in run["results"]:
            rows.append(
                f"{r['world']:<5} {r['contender']:<13} {r['mode']:<10} {r.get('model') or '':<5} "
                f"{r.get('precision') or '':<5} {r['batch_per_gpu']:<8} "
                f"{r['samples_per_s'] / 1e6:11.3f} {r['step_ms_median']:9.2f} "
                f"{r['bytes_per_sample']:9.0f}"
            )
    return "\n".join(rows)


def write_report(out: Path, workload_dir: Path | None = None) -> tuple[Path, Path, str]:
    """Write ``results.json`` and ``results.md`` under ``out``; returns them and the short table."""
    runs = load_runs(out)
    if not runs:
        raise FileNotFoundError(f"{out}: no results_w*.json or raw_w*.jsonl to report")
    workload = None
    if workload_dir is not None and (workload_dir / "workload.json").exists():
        workload = json.loads((workload_dir / "workload.json").read_text())
        workload.pop("cardinalities", None)
    hl = headline([r for run in runs for r in run["results"]])
    js = out / "results.json"
    js.write_text(json.dumps({"workload": workload, "headline": hl, "runs": runs}, indent=2))
    md = out / "results.md"
    md.write_text(markdown(runs, workload))
    return js, md, short_table(runs) + ("\n" + "\n".join(hl) if hl else "")
