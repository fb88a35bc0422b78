"""Records of ``bench/gpu/run8.sh``: one JSON line per measured run, with a resume key.

Every record has ``key``, ``contender``, ``variant``, ``model``, ``gpus`` (ranks: GPUs, or CPU
ranks with ``DEVICE=cpu``), ``batch`` (per rank), ``samples_per_s``, ``val_auc`` (``None`` for
the all-to-all contenders, which time training steps on random labels), ``bytes_per_sample``,
``launcher``, ``placement``, ``status``, ``machine``, ``command`` and ``date``. The CLI's records
come from its ``--output`` JSON through :func:`bench.gpu.train_report.cli_record` (the same
fields as ``train_gpu.sh``'s), the contenders' from ``bench/gpu/cli.py run``'s ``raw_w*.jsonl``.
A run whose key already has a record with status ``ok`` is not run again (``run8_stages.sh``'s
``done_ok``), so ``run8.sh`` resumes across calls; a failed run is retried and its latest
record wins in the report.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.gpu.train_report import CLI, append, cli_record, now, read_records

CONTENDERS = ("rowwise", "tablewise")


def cli_key(launcher: str, placement: str, gpus: int, batch: int, model: str) -> str:
    """The resume key of one CLI run."""
    return f"{CLI}|{launcher}|{placement}|g{gpus}|b{batch}|{model}"


def contender_key(name: str, gpus: int, batch: int, model: str) -> str:
    """The resume key of one all-to-all contender's configuration."""
    return f"{name}|torchrun|g{gpus}|b{batch}|{model}"


def latest(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last record of every key, in first-seen order (a retried run replaces its failure)."""
    by_key: dict[str, dict[str, Any]] = {}
    for r in records:
        by_key[str(r.get("key"))] = r  # (a dict keeps a key's first position on reassignment)
    return list(by_key.values())


def add_cli(a: argparse.Namespace) -> dict[str, Any]:
    """Append the record of one CLI run (a failure record when it left no results JSON)."""
    res = a.result if a.result is not None and a.result.exists() else None
    ns = argparse.Namespace(
        variant=a.variant, model=a.model, gpus=a.gpus, batch=a.batch, iters=a.iters,
        wall_s=a.wall_s, rc=a.rc, command=a.command, machine=a.machine,
    )  # fmt: skip
    rec = cli_record(json.loads(res.read_text()) if res else None, ns)
    if a.status:  # e.g. "skipped: no mpirun on this machine"
        rec["status"] = a.status
    rec.update(
        key=cli_key(a.launcher, a.placement, a.gpus, a.batch, a.model), launcher=a.launcher,
        placement=a.placement, store_rate=a.store_rate, bound=a.bound, device=a.device,
    )  # fmt: skip
    append(a.records, rec)
    return rec


def contender_record(raw: dict[str, Any], command: str, device: str) -> dict[str, Any]:
    """A run8 record from one ``bench/gpu/cli.py run`` record (train mode)."""
    machine = raw.get("machine") or {}
    where = machine.get("gpu") or f"{machine.get('cpus', '?')} cpus"
    return {
        "key": contender_key(raw["contender"], raw["world"], raw["batch_per_gpu"], raw["model"]),
        "contender": raw["contender"],
        "variant": f"all-to-all, bulk-synchronous, {raw.get('precision')}, "
        f"{raw['steps']} timed steps",
        "model": raw["model"], "gpus": raw["world"], "batch": raw["batch_per_gpu"],
        "global_batch": raw["batch_per_gpu"] * raw["world"],
        "samples_seen": raw["steps"] * raw["batch_per_gpu"] * raw["world"],  # (timed steps)
        "samples_per_s": raw["samples_per_s"], "ms_per_step": raw["step_ms_median"],
        "val_auc": None, "bytes_per_sample": raw["bytes_per_sample"],
        "bytes_per_sample_by_kind": raw.get("bytes_per_sample_by_kind"),
        "phases_ms": raw.get("phases_ms"), "peak_mem_gib": raw.get("peak_mem_gib"),
        "launcher": "torchrun", "placement": raw["contender"], "embed_dim": raw.get("dim"),
        "status": "ok", "device": device,
        "machine": f"{machine.get('host', '?')}, {where}, torch {machine.get('torch', '?')}",
        "command": command, "date": machine.get("date") or now(),
    }  # fmt: skip


def add_contenders(a: argparse.Namespace) -> list[dict[str, Any]]:
    """Append a record per train-mode line of ``raw_w*.jsonl`` (what the run measured so far)."""
    out = []
    for raw in read_records(a.raw):
        if raw.get("mode") == "train":
            rec = contender_record(raw, a.command, a.device)
            append(a.records, rec)
            out.append(rec)
    return out


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``add-cli`` and ``add-contenders`` on ``run8_report.py``'s parser."""
    c = sub.add_parser("add-cli", help="append one CLI run's record")
    c.add_argument("--records", type=Path, required=True)
    c.add_argument("--result", type=Path, default=None, help="the CLI's --output JSON")
    c.add_argument("--launcher", required=True, choices=("torchrun", "mpirun"))
    c.add_argument("--placement", required=True, help="whole, plan or hash")
    c.add_argument("--model", required=True)
    c.add_argument("--batch", type=int, required=True)
    c.add_argument("--gpus", type=int, required=True)
    c.add_argument("--store-rate", type=float, default=0.0)
    c.add_argument("--bound", type=int, default=0)
    c.add_argument("--iters", type=int, default=0)
    c.add_argument("--wall-s", type=float, default=None)
    c.add_argument("--rc", type=int, default=0)
    c.add_argument("--variant", default="")
    c.add_argument("--status", default="")
    c.add_argument("--device", default="cuda")
    c.add_argument("--machine", default="")
    c.add_argument("--command", default="")
    k = sub.add_parser("add-contenders", help="append the contenders' records from raw_w*.jsonl")
    k.add_argument("--records", type=Path, required=True)
    k.add_argument("--raw", type=Path, required=True)
    k.add_argument("--device", default="cuda")
    k.add_argument("--command", default="")
