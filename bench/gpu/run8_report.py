#!/usr/bin/env python
"""Records and report of ``bench/gpu/run8.sh`` (issue 18: the card's runs on N GPUs).

    python bench/gpu/run8_report.py add-cli --records R.jsonl --result cli.json --launcher mpirun ...
    python bench/gpu/run8_report.py add-contenders --records R.jsonl --raw raw_w8.jsonl
    python bench/gpu/run8_report.py report --work WORK --out RES --dataset DS --ranks 8 ...

``report`` writes ``run8.json`` (settings, every record, the scaling against the CLI's own
1-GPU speed, bytes/sample against hash placement, the all-to-all bandwidth, the sweeps' rows),
``run8.md`` and ``run8.png`` (samples/s per run; bytes/sample per placement) into ``--out``, and
copies the sweeps' CSV, PNG and markdown (made by :mod:`hetgmp.experiments`) next to them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench.gpu` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu import run8_records as R  # noqa: E402
from bench.gpu.train_report import CLI, dataset_meta, fmt, now, ok, read_records  # noqa: E402

SCALING_TARGET = 7.0 / 8.0  # the card: at least 7x at 8 GPUs, i.e. 87.5 % of linear
SWEEPS = ("staleness", "store_rate")
CPU_NOTE = (
    "**Throughput here is not meaningful**: the ranks are CPU processes (gloo) sharing a few "
    "cores with other jobs, so samples/s, scaling and bandwidth measure contention, not the "
    "method. Bytes/sample, mirror hit rates and AUC are exact and are what these runs are for."
)


def rate(x: float | None) -> str:
    """samples/s in words: millions on GPUs, plain numbers for the slow CPU ranks."""
    if not x:
        return "-"
    return f"{x / 1e6:.2f}M" if x >= 1e5 else f"{x:,.0f}"


def cli_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("contender") == CLI]


def find(records: list[dict[str, Any]], **want: Any) -> dict[str, Any] | None:
    """The first ok record whose fields equal ``want``."""
    for r in records:
        if ok(r) and all(r.get(k) == v for k, v in want.items()):
            return r
    return None


def scaling(records: list[dict[str, Any]], ranks: int) -> list[dict[str, Any]]:
    """Per batch and launcher: the N-rank CLI run (plan) against the CLI's 1-rank run."""
    out = []
    for batch in sorted({r["batch"] for r in cli_records(records)}):
        one = find(records, contender=CLI, gpus=1, batch=batch, placement="whole")
        for launcher in ("torchrun", "mpirun"):
            many = find(records, contender=CLI, gpus=ranks, batch=batch, placement="plan",
                        launcher=launcher)  # fmt: skip
            if ranks < 2 or one is None or many is None:
                continue
            x = many["samples_per_s"] / one["samples_per_s"]
            out.append({
                "batch": batch, "launcher": launcher, "gpus": ranks,
                "samples_per_s": many["samples_per_s"], "one_gpu_samples_per_s": one["samples_per_s"],
                "speedup": x, "efficiency": x / ranks, "target_speedup": SCALING_TARGET * ranks,
                "meets_target": x >= SCALING_TARGET * ranks,
            })  # fmt: skip
    return out


def bytes_vs_hash(records: list[dict[str, Any]], ranks: int) -> list[dict[str, Any]]:
    """Per batch: bytes/sample of the plan and of the contenders against hash placement."""
    out = []
    for batch in sorted({r["batch"] for r in records}):
        hash_ = find(records, contender=CLI, gpus=ranks, batch=batch, placement="hash")
        if hash_ is None or ranks < 2:
            continue
        base = hash_.get("bytes_per_sample") or 0.0
        rows = [hash_]
        plan = find(records, contender=CLI, gpus=ranks, batch=batch, placement="plan",
                    launcher="torchrun") or find(records, contender=CLI, gpus=ranks, batch=batch,
                                                 placement="plan")  # fmt: skip
        rows += [r for r in [plan] if r is not None]
        rows += [r for name in R.CONTENDERS
                 if (r := find(records, contender=name, gpus=ranks, batch=batch))]  # fmt: skip
        for r in rows:
            b = r.get("bytes_per_sample")
            out.append({
                "batch": batch, "contender": r["contender"], "placement": r.get("placement"),
                "store_rate": r.get("store_rate"), "bound": r.get("bound"), "bytes_per_sample": b,
                "x_hash": b / base if base and b is not None else None, "val_auc": r.get("val_auc"),
            })  # fmt: skip
    return out


def sweep_rows(sweeps: Path) -> dict[str, list[dict[str, Any]]]:
    """The rows of the sweeps' CSVs (the key columns only)."""
    from hetgmp.experiments.table import RunTable

    cols = ("ranks", "bound", "store_rate", "batch_size", "iters", "val_auc", "val_logloss",
            "bytes_per_sample", "mirror_hit", "remote_rows_per_step", "samples_per_s", "status")  # fmt: skip
    out = {}
    for name in SWEEPS:
        path = sweeps / f"{name}.csv"
        if path.exists():
            out[name] = [{c: r.get(c) for c in cols} for r in RunTable(path).rows]
    return out


def run_table(records: list[dict[str, Any]]) -> list[str]:
    lines = ["| contender | launcher | ranks | placement | batch/rank | samples/s | ms/step "
             "| val AUC | bytes/sample | samples | wall s | status |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in records:
        lines.append(
            f"| {r['contender']} | {r.get('launcher', '')} | {r['gpus']} | {r.get('placement', '')} "
            f"| {r['batch']} | {rate(r.get('samples_per_s'))} | {fmt(r.get('ms_per_step'))} "
            f"| {fmt(r.get('val_auc'), '.4f')} | {fmt(r.get('bytes_per_sample'), '.1f')} "
            f"| {fmt(r.get('samples_seen'), ',')} | {fmt(r.get('wall_s'), '.0f')} "
            f"| {r.get('status', 'ok')} |"
        )
    return lines


def scaling_lines(rows: list[dict[str, Any]], ranks: int, device: str) -> list[str]:
    if ranks < 2:
        return ["(1 rank on this machine: no scaling to measure; the 1-rank runs above are the "
                "baseline a multi-GPU run of this script compares against)"]  # fmt: skip
    if not rows:
        return ["(no pair of finished 1-rank and N-rank CLI runs yet)"]
    if device == "cpu":  # the ranks share the cores: their speed ratio says nothing of scaling
        return [f"- batch {s['batch']}/rank, {s['launcher']}: {ranks} CPU ranks "
                f"{rate(s['samples_per_s'])}/s vs 1 rank {rate(s['one_gpu_samples_per_s'])}/s "
                f"(ratio {s['speedup']:.2f}; CPU ranks sharing cores: not a scaling figure)"
                for s in rows]  # fmt: skip
    return [
        f"- batch {s['batch']}/rank, {s['launcher']}: {ranks} ranks {rate(s['samples_per_s'])}/s "
        f"vs 1 rank {rate(s['one_gpu_samples_per_s'])}/s = **{s['speedup']:.2f}x** "
        f"({100 * s['efficiency']:.0f} % of linear; the card's target {s['target_speedup']:.1f}x: "
        f"{'met' if s['meets_target'] else 'not met'})"
        for s in rows
    ]


def hash_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return ["(needs a finished hash-placement run on 2+ ranks)"]
    lines = ["The CLI's runs share the data set; the contenders time steps on their own generated "
             "ids (same cardinalities and id law), so their bytes compare approximately.", "",
             "| batch/rank | contender | placement | store rate | bound | bytes/sample | x hash "
             "| val AUC |", "|---:|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['contender']} | {r['placement']} | {fmt(r['store_rate'])} "
            f"| {fmt(r['bound'])} | {fmt(r['bytes_per_sample'], '.1f')} | {fmt(r['x_hash'], '.3f')} "
            f"| {fmt(r['val_auc'], '.4f')} |"
        )
    return lines


def a2a_lines(a2a: dict[str, Any] | None) -> list[str]:
    if not a2a:
        return ["(not measured yet: STAGE=nccl)"]
    lines = [f"backend {a2a['backend']}, {a2a['world']} rank(s), {a2a['iters']} timed calls per "
             f"size. {a2a.get('note') or ''}", "",
             "| MiB per rank | ms | algbw GB/s | busbw GB/s |", "|---:|---:|---:|---:|"]  # fmt: skip
    for r in a2a["results"]:
        lines.append(f"| {r['bytes_per_rank'] / 2**20:.2f} | {r['time_ms']:.3f} "
                     f"| {r['algbw_gbs']:.2f} | {r['busbw_gbs']:.2f} |")  # fmt: skip
    return lines


def sweep_section(name: str, res: Path) -> list[str]:
    md = res / f"{name}.md"
    if not md.exists():
        return ["(not run yet: STAGE=sweeps; needs 2+ ranks)"]
    body = md.read_text().splitlines()
    body = body[1:] if body and body[0].startswith("# ") else body
    while body and not body[0].strip():
        body = body[1:]
    return body


def build_markdown(payload: dict[str, Any], res: Path) -> str:
    s, ranks = payload["settings"], payload["ranks"]
    unit = "CPU ranks" if payload["device"] == "cpu" else "GPUs"
    lines = [
        f"# The card's runs on {ranks} {unit} (`bench/gpu/run8.sh`)", "",
        f"- machine: {payload['machine']}",
        f"- report written {payload['date']}; calls (date, commit, command): "
        + "; ".join(f"`{c}`" for c in payload["calls"]),
        f"- data: `{s['dataset']}`: {s.get('train_samples')} train / {s.get('test_samples')} "
        f"test samples, {s.get('num_fields')} fields, {s.get('num_rows')} rows; plan "
        f"`partition/partition.py -n {ranks}` ({s['method']}, batch {s['plan_batch']})",
        f"- CLI: `examples/hetuctr.py --device {payload['device']}`, {s['model']}, dim "
        f"{s['embed_dim']}, {s['iters_text']}; N-rank runs with `--partition` plan "
        f"`--bound {s['bound']} --store_rate {s['store_rate']}`; hash = the same without "
        "`--partition`; the 1-rank run holds the whole table",
        "- contenders: `bench/gpu/cli.py run --modes train` (row-wise `id % world` and "
        "table-wise shards, all-to-all, bulk-synchronous, plain SGD; timed steps on the "
        "benchmark's own generated ids with random labels: speed and bytes only, no AUC)", "",
    ]  # fmt: skip
    if payload["device"] == "cpu":
        lines += [CPU_NOTE, ""]
    lines += ["## Every run", "", *run_table(payload["records"]), "",
              "## Scaling against the CLI's own 1-GPU speed", "",
              *scaling_lines(payload["scaling"], ranks, payload["device"]), "",
              "## Bytes/sample against hash placement", "", *hash_lines(payload["bytes_vs_hash"]),
              "", "## All-to-all bandwidth (`bench/gpu/alltoall_bw.py`)", "",
              *a2a_lines(payload["alltoall"]), "", "![runs](run8.png)", ""]  # fmt: skip
    for name in SWEEPS:
        lines += [f"## {name.replace('_', '-')} sweep ({ranks} ranks)", "",
                  *sweep_section(name, res), ""]  # fmt: skip
    return "\n".join(lines)


def plot(payload: dict[str, Any], path: Path) -> Path | None:
    """samples/s of every finished run, and bytes/sample per placement (hetgmp's plot setup)."""
    from hetgmp.experiments import plots

    try:
        plt = plots.pyplot()
    except plots.PlotsUnavailableError as err:
        print(f"[run8] no run8.png: {err}")
        return None
    runs = [r for r in payload["records"] if ok(r)]
    if not runs:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"cli {r['launcher']} {r['placement']} {r['gpus']}r b{r['batch']}"
              if r["contender"] == CLI else f"{r['contender']} {r['gpus']}r b{r['batch']}"
              for r in runs]  # fmt: skip
    a1.barh(range(len(runs)), [r["samples_per_s"] for r in runs], color="tab:blue")
    a1.set_yticks(range(len(runs)), labels, fontsize=7)
    a1.invert_yaxis()
    a1.set_xlabel("samples/s")
    hb = payload["bytes_vs_hash"]
    if hb:
        names = [f"cli {r['placement']} b{r['batch']}" if r["contender"] == CLI
                 else f"{r['contender']} b{r['batch']}" for r in hb]  # fmt: skip
        a2.barh(range(len(hb)), [r["bytes_per_sample"] or 0.0 for r in hb], color="tab:red")
        a2.set_yticks(range(len(hb)), names, fontsize=7)
        a2.invert_yaxis()
    a2.set_xlabel("embedding bytes sent / sample")
    fig.suptitle(f"{payload['ranks']} {'CPU ranks' if payload['device'] == 'cpu' else 'GPUs'}: "
                 "samples/s per run; bytes/sample against hash placement")  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=plots.DPI)
    plt.close(fig)
    return path


def report(a: argparse.Namespace) -> dict[str, Any]:
    work, res = Path(a.work), Path(a.out)
    res.mkdir(parents=True, exist_ok=True)
    records = R.latest(read_records(work / "records.jsonl"))
    a2a_path = work / "alltoall.json"
    for name in SWEEPS:  # the sweeps' own CSV / PNG / markdown, next to the report
        for ext in ("csv", "png", "md"):
            src = work / "sweeps" / f"{name}.{ext}"
            if src.exists() and src.resolve() != (res / src.name).resolve():
                shutil.copy2(src, res / src.name)
    calls = (work / "calls.txt").read_text().splitlines() if (work / "calls.txt").exists() else []
    settings = {**json.loads(a.settings), **(dataset_meta(Path(a.dataset)) if a.dataset else {})}
    payload = {
        "machine": a.machine, "date": now(), "device": a.device, "ranks": a.ranks,
        "calls": calls, "settings": settings, "records": records,
        "scaling": scaling(records, a.ranks), "bytes_vs_hash": bytes_vs_hash(records, a.ranks),
        "alltoall": json.loads(a2a_path.read_text()) if a2a_path.exists() else None,
        "sweeps": sweep_rows(work / "sweeps"),
    }  # fmt: skip
    (res / "run8.json").write_text(json.dumps(payload, indent=2, sort_keys=True, default=str))
    plot(payload, res / "run8.png")
    (res / "run8.md").write_text(build_markdown(payload, res))
    return payload


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    R.add_parsers(sub)
    r = sub.add_parser("report", help="run8.json, run8.md, run8.png from WORK into OUT")
    r.add_argument("--work", type=Path, required=True, help="run8.sh's WORK directory")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--dataset", default="", help="the CLI's data set (its shape goes in)")
    r.add_argument(
        "--ranks", type=int, required=True, help="GPUs (or CPU ranks) of the N-rank runs"
    )
    r.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    r.add_argument("--machine", default="")
    r.add_argument("--settings", default="{}", help="JSON: the script's settings")
    a = p.parse_args(argv)
    if a.cmd == "add-cli":
        R.add_cli(a)
    elif a.cmd == "add-contenders":
        n = len(R.add_contenders(a))
        print(f"[run8] {n} contender record(s) from {a.raw}")
    else:
        payload = report(a)
        done = sum(ok(x) for x in payload["records"])
        print(f"[run8] report: {done} finished run(s) of {len(payload['records'])}; "
              f"{a.out / 'run8.md'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
