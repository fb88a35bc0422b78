#!/usr/bin/env python
"""Records and report of ``bench/gpu/train_gpu.sh``: the training CLI vs plain PyTorch.

    python bench/gpu/train_report.py add-cli --result R.json --records RAW.jsonl --model wdl \\
        --batch 8192 --gpus 2 --wall-s 31 --rc 0 --command "..."
    python bench/gpu/train_report.py add-failed --records RAW.jsonl --contender plain-pytorch ...
    python bench/gpu/train_report.py report --records RAW.jsonl --dataset DIR --out RES

``add-cli`` turns the CLI's ``--output`` JSON into one record (or a failure record when the run
left none); plain_ctr.py appends its records to the same JSON-lines file. ``report`` writes
``train_cli.json`` (the list of records) and ``train_cli.md``: every run, the ratio of each to
the best plain-PyTorch run of the same model and batch, the CLI's 2-GPU vs 1-GPU scaling, AUC
deltas, per-phase step times where the CLI reports them, and the floor of each step from HBM
bytes and FLOPs at H200 rates (:func:`step_floor`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench.gpu` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PLAIN, CLI = "plain-pytorch", "hetgmp-cli"
# H200 SXM: HBM3e bandwidth, dense tensor-core rates (bf16; TF32 is half of it).
H200 = {"hbm_bytes_per_s": 4.8e12, "bf16_flop_per_s": 990e12, "tf32_flop_per_s": 495e12}
PHASES = ("data_wait", "embedding", "dense_fwd_bwd", "sync", "optimizers", "total")
CLI_OPT = "adagrad"  # the CLI's default --optimizer (row-wise Adagrad)
SANE_AUC = 0.55  # a run below this did not train (e.g. a broken fast path): never the "best"


def dense_params(model: str, num_fields: int, embed_dim: int, num_dense: int) -> int:
    """Parameters of the dense head (built on the meta device: no memory, the real shapes)."""
    import torch  # (imported here: recording runs and reporting them need no torch, ~1 s a call)

    from bench.gpu.plain_models import HEADS

    with torch.device("meta"):
        head = HEADS[model](num_fields * embed_dim + num_dense)
    return sum(p.numel() for p in head.parameters())


def step_floor(
    model: str, batch: int, num_fields: int, embed_dim: int, num_dense: int, amp: bool,
    rates: dict[str, float] = H200,
) -> dict[str, float]:  # fmt: skip
    """Lower bound of one GPU's step: embedding rows through HBM and the head's FLOPs.

    Embedding: ``batch x fields x dim x 4 bytes x 3`` (rows read in the forward, the gradient
    rows written, the update's read-modify-write of the rows; ids and optimizer state ignored).
    Head: ``2 x params x batch x 3`` (forward, and backward for inputs and weights), at the bf16
    tensor-core rate with ``amp``, else TF32. Neither overlaps the other in the bound.
    """
    emb_bytes = batch * num_fields * embed_dim * 4 * 3
    flops = 2 * dense_params(model, num_fields, embed_dim, num_dense) * batch * 3
    emb_ms = 1e3 * emb_bytes / rates["hbm_bytes_per_s"]
    rate = rates["bf16_flop_per_s"] if amp else rates["tf32_flop_per_s"]
    mlp_ms = 1e3 * flops / rate
    return {"embedding_bytes": emb_bytes, "embedding_ms": emb_ms, "mlp_flops": flops,
            "mlp_ms": mlp_ms, "total_ms": emb_ms + mlp_ms}  # fmt: skip


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def cli_record(result: dict[str, Any] | None, a: argparse.Namespace) -> dict[str, Any]:
    """One record from the CLI's results JSON (None: the run left none, so it failed)."""
    variant = a.variant or ("whole table on the GPU" if a.gpus == 1 else "")
    rec: dict[str, Any] = {
        "contender": CLI, "variant": variant, "model": a.model, "gpus": a.gpus,
        "batch": a.batch, "global_batch": a.batch * a.gpus, "iters": a.iters,
        "wall_s": a.wall_s, "rc": a.rc, "command": a.command, "date": now(),
    }  # fmt: skip
    if result is None:
        return {**rec, "status": f"failed (exit {a.rc}): no results JSON", "samples_per_s": None,
                "val_auc": None, "machine": a.machine}  # fmt: skip
    speed = result.get("speed")
    cfg = result.get("config") or {}
    rec.update({
        "status": "ok", "samples_per_s": speed, "val_auc": result.get("val_auc"),
        "val_loss": result.get("val_loss"), "step_ms": result.get("step_ms"),
        "ms_per_step": 1e3 * a.batch * a.gpus / speed if speed else None,
        "warmup": result.get("warmup_steps"), "epoch": result.get("epoch"),
        "samples_seen": result.get("samples_seen"), "amp": bool(cfg.get("amp", False)),
        "bytes_per_sample": (result.get("embedding_train") or {}).get("bytes_per_sample"),
        "sparse_opt": cfg.get("optimizer"), "dense_opt": cfg.get("dense_optimizer"),
        "embed_dim": cfg.get("embed_dim"), "machine": result.get("machine") or a.machine,
        "torch": result.get("torch"), "cli_command": result.get("command"),
        "cli_date": result.get("date"),
    })  # fmt: skip
    return rec


def append(path: Path, rec: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(rec, sort_keys=True, default=str) + "\n")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON-lines file (a torn last line, from a killed run, is skipped)."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def ok(r: dict[str, Any]) -> bool:
    return bool(r.get("samples_per_s")) and r.get("status", "ok") == "ok"


def best_plain(
    records: list[dict[str, Any]], model: str, batch: int, opt: str | None = None
) -> dict[str, Any] | None:
    """The fastest plain-PyTorch run of (model, batch) that trained (AUC >= SANE_AUC), among
    those with table optimizer ``opt`` when given."""
    cands = [
        r for r in records
        if r["contender"] == PLAIN and r["model"] == model and r["batch"] == batch and ok(r)
        and isinstance(r.get("val_auc"), float) and r["val_auc"] >= SANE_AUC
        and (opt is None or r.get("sparse_opt") == opt)
    ]  # fmt: skip
    return max(cands, key=lambda r: r["samples_per_s"], default=None)


def fmt(x: Any, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec) if isinstance(x, (int, float)) else str(x)


def rate(x: float | None) -> str:
    return "-" if not x else f"{x / 1e6:.2f}M"


def groups(records: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(model, batch) pairs in first-seen order (the script's priority order)."""
    seen: dict[tuple[str, int], None] = {}
    for r in records:
        seen.setdefault((r["model"], r["batch"]), None)
    return list(seen)


def run_rows(records: list[dict[str, Any]]) -> list[str]:
    """One row per run, with its speed ratio and AUC delta against the best plain run."""
    lines = [
        "| model | batch/GPU | contender | variant | GPUs | samples/s | ms/step | val AUC "
        "| x plain best | AUC - plain best | wall s | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, batch in groups(records):
        best = best_plain(records, model, batch)
        for r in (r for r in records if (r["model"], r["batch"]) == (model, batch)):
            ratio = r["samples_per_s"] / best["samples_per_s"] if best and ok(r) else None
            d_auc = (
                (r["val_auc"] - best["val_auc"]) if best and ok(r) and r.get("val_auc") else None
            )
            tag = " (best)" if r is best else ""
            lines.append(
                f"| {model} | {batch} | {r['contender']}{tag} | {r.get('variant', '')} "
                f"| {r['gpus']} | {rate(r.get('samples_per_s'))} | {fmt(r.get('ms_per_step'))} "
                f"| {fmt(r.get('val_auc'), '.4f')} | {fmt(ratio, '.2f')} | {fmt(d_auc, '+.4f')} "
                f"| {fmt(r.get('wall_s'), '.0f')} | {r.get('status', 'ok')} |"
            )
    return lines


def headline_lines(records: list[dict[str, Any]]) -> list[str]:
    """Per (model, batch): CLI 1 and 2 GPUs vs plain best, and the CLI's 2-GPU scaling."""
    out = []
    for model, batch in groups(records):
        best = best_plain(records, model, batch)
        mine = [
            r for r in records
            if r["contender"] == CLI and (r["model"], r["batch"]) == (model, batch) and ok(r)
        ]  # fmt: skip
        # the headline is the CLI with its default flags; variants (e.g. --amp) are listed after
        cli = {r["gpus"]: r for r in mine if "--" not in str(r.get("variant", ""))}
        variants = [r for r in mine if "--" in str(r.get("variant", ""))]
        parts = [
            f"plain best {rate(best['samples_per_s'])}/s ({best.get('variant')}, "
            f"AUC {fmt(best.get('val_auc'), '.4f')})"
            if best
            else "no plain run trained"
        ]
        for g in sorted(cli):
            r = cli[g]
            part = f"CLI {g} GPU{'s' if g > 1 else ''} {rate(r['samples_per_s'])}/s"
            if best:
                part += f" = **{r['samples_per_s'] / best['samples_per_s']:.2f}x** plain best"
            parts.append(part + f", AUC {fmt(r.get('val_auc'), '.4f')}")
        same = best_plain(records, model, batch, CLI_OPT)
        if same and same is not best:  # like for like: the CLI's own table optimizer
            parts.append(f"plain with {CLI_OPT} (the CLI's table optimizer) "
                         f"{rate(same['samples_per_s'])}/s, AUC {fmt(same.get('val_auc'), '.4f')}")  # fmt: skip
        for r in variants:
            flags = str(r["variant"]).split(", ")[-1]
            parts.append(f"CLI {r['gpus']} GPU {flags} {rate(r['samples_per_s'])}/s, "
                         f"AUC {fmt(r.get('val_auc'), '.4f')}")  # fmt: skip
        if 1 in cli and 2 in cli:
            parts.append(
                f"CLI 2 GPUs / 1 GPU = **{cli[2]['samples_per_s'] / cli[1]['samples_per_s']:.2f}x**"
            )
        out.append(f"- {model}, batch {batch}/GPU: " + "; ".join(parts))
    return out


def phase_rows(records: list[dict[str, Any]]) -> list[str]:
    """Per-phase ms/step of the CLI runs that report ``step_ms`` (``--profile-steps``). With the
    whole-step CUDA graph the profiled steps run eagerly (their phases are split by events);
    ``graph ms`` is the device time of a replayed step and ``GPU busy`` its share of the
    measured wall time per step."""
    rows = [r for r in records if isinstance(r.get("step_ms"), dict)]
    if not rows:
        return ["(no run reported per-phase times: the CLI has no `--profile-steps` yet)"]
    lines = ["| model | batch/GPU | GPUs | variant | " + " | ".join(PHASES)
             + " | graph ms | step ms | GPU busy |",
             "|---|---|---|---|" + "---|" * (len(PHASES) + 3)]  # fmt: skip
    for r in rows:
        ms = r["step_ms"]
        graph, step = ms.get("graph_replay_ms"), r.get("ms_per_step")
        busy = f"{100 * graph / step:.0f} %" if graph and step else "-"
        lines.append(f"| {r['model']} | {r['batch']} | {r['gpus']} | {r.get('variant', '')} | "
                     + " | ".join(fmt(ms.get(p), ".3f") for p in PHASES)
                     + f" | {fmt(graph, '.3f')} | {fmt(step, '.3f')} | {busy} |")  # fmt: skip
    lines += [
        "",
        "(phases: eager profiled steps when the step is a CUDA graph; `graph ms`: one "
        "replayed step's device time; GPU busy = graph ms / measured ms per step)",
    ]
    return lines


def floor_rows(records: list[dict[str, Any]], meta: dict[str, int]) -> list[str]:
    """The step floor per run (HBM bytes and FLOPs at H200 rates) against the measured step."""
    lines = [
        "| model | batch/GPU | contender | variant | GPUs | emb MB/GPU | emb floor ms | MLP GFLOP "
        "| MLP floor ms | floor ms | measured ms | measured / floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if not ok(r):
            continue
        dim = int(r.get("embed_dim") or meta.get("embed_dim", 128))
        f = step_floor(r["model"], r["batch"], meta["num_fields"], dim, meta["num_dense"],
                       bool(r.get("amp")))  # fmt: skip
        ms = r.get("ms_per_step")
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['contender']} | {r.get('variant', '')} "
            f"| {r['gpus']} | {f['embedding_bytes'] / 1e6:.0f} | {f['embedding_ms']:.3f} "
            f"| {f['mlp_flops'] / 1e9:.1f} | {f['mlp_ms']:.3f} | {f['total_ms']:.3f} "
            f"| {fmt(ms, '.3f')} | {fmt(ms / f['total_ms'] if ms else None, '.1f')} |"
        )
    return lines


def build_markdown(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The whole ``train_cli.md``."""
    first = next((r for r in records if r.get("machine")), {})
    lines = [
        "# Training on GPUs: the hetgmp CLI vs plain PyTorch (`bench/gpu/train_gpu.sh`)",
        "",
        f"- machine: {first.get('machine', '?')}; report written {now()}",
        f"- command: `{meta.get('command', 'bash bench/gpu/train_gpu.sh')}`",
        f"- data: {meta.get('dataset', '?')}: {meta.get('train_samples', '?')} train / "
        f"{meta.get('test_samples', '?')} test samples, {meta['num_fields']} fields, "
        f"{meta.get('num_rows', '?')} rows, {meta['num_dense']} dense",
        f"- steps: {meta.get('steps', '?')} (the same for every contender of a batch size, so "
        "AUCs compare after the same number of steps; the first warm-up steps are not timed)",
        "- plain PyTorch: one GPU, `bench/gpu/plain_ctr.py` (fused sparse `nn.Embedding`, fused "
        "Adam, TF32, data on the GPU); 'best' = the fastest variant that trained "
        f"(AUC >= {SANE_AUC}); the CLI: `examples/hetuctr.py` defaults under torchrun",
        "",
        "## Headlines",
        "",
        *headline_lines(records),
        "",
        "## Every run",
        "",
        *run_rows(records),
        "",
        "## Where the CLI's step goes (ms/step, `--profile-steps`)",
        "",
        *phase_rows(records),
        "",
        "## Floors (H200: 4.8 TB/s HBM, 990 TFLOP/s bf16 dense, 495 TF32)",
        "",
        "Per GPU and step: embedding = batch x fields x dim x 4 B x 3 (rows read, gradient "
        "written, rows updated); MLP = 2 x dense params x batch x 3 (forward + backward). The "
        "CLI's exchange, optimizer state and launch overheads are above this floor by design.",
        "",
        *floor_rows(records, meta),
        "",
    ]
    return "\n".join(lines)


def short_table(records: list[dict[str, Any]]) -> str:
    """The few columns the shell prints last."""
    rows = [f"{'model':5} {'batch':>6} {'contender':14} {'variant':26} {'gpus':>4} "
            f"{'samples/s':>10} {'val_auc':>7}  status"]  # fmt: skip
    for r in records:
        rows.append(
            f"{r['model']:5} {r['batch']:>6} {r['contender']:14} {str(r.get('variant', ''))[:26]:26} "
            f"{r['gpus']:>4} {rate(r.get('samples_per_s')):>10} {fmt(r.get('val_auc'), '.4f'):>7}  "
            f"{r.get('status', 'ok')}"
        )
    return "\n".join(rows)


def dataset_meta(path: Path) -> dict[str, Any]:
    from hetgmp.data.format import open_dataset

    m = open_dataset(path).meta
    return {"dataset": str(path), "num_fields": m.num_fields, "num_dense": m.num_dense,
            "num_rows": m.num_embeddings, "train_samples": m.splits.get("train"),
            "test_samples": m.splits.get("test")}  # fmt: skip


def write_report(records: list[dict[str, Any]], out: Path, meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_cli.json").write_text(json.dumps(records, indent=2, sort_keys=True, default=str))
    (out / "train_cli.md").write_text(build_markdown(records, meta))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("add-cli", "add-failed"):
        s = sub.add_parser(name)
        s.add_argument("--records", type=Path, required=True)
        s.add_argument("--model", required=True)
        s.add_argument("--batch", type=int, required=True)
        s.add_argument("--gpus", type=int, default=1)
        s.add_argument("--iters", type=int, default=None)
        s.add_argument("--wall-s", type=float, default=None)
        s.add_argument("--rc", type=int, default=0)
        s.add_argument("--command", default="")
        s.add_argument("--machine", default="")
        s.add_argument("--variant", default="")
        s.add_argument("--result", type=Path, default=None)
        s.add_argument("--contender", default=CLI)
        s.add_argument("--status", default="")
    r = sub.add_parser("report")
    r.add_argument("--records", type=Path, required=True)
    r.add_argument("--dataset", type=Path, required=True)
    r.add_argument("--dataset-meta", type=json.loads, default=None,
                   help="the data set's shape as JSON (num_fields, num_dense, num_rows, "
                   "train_samples, test_samples) when DIR is not on this machine (re-reporting "
                   "records brought back from a GPU machine)")  # fmt: skip
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--command", default="bash bench/gpu/train_gpu.sh")
    r.add_argument("--steps", default="?")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.cmd == "add-cli":
        res = a.result if a.result is not None and a.result.exists() else None
        append(a.records, cli_record(json.loads(res.read_text()) if res else None, a))
    elif a.cmd == "add-failed":
        rec = cli_record(None, a)
        rec.update(contender=a.contender, status=a.status or rec["status"])
        append(a.records, rec)
    else:
        records = read_records(a.records)
        shape = dataset_meta(a.dataset) if a.dataset_meta is None else {
            "dataset": str(a.dataset), **a.dataset_meta}  # fmt: skip
        meta = {**shape, "command": a.command, "steps": a.steps}
        write_report(records, a.out, meta)
        print(short_table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
