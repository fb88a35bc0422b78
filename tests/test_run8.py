"""bench/gpu/run8.sh (issue 18) on CPU ranks: the script end to end, its records and report.

``DEVICE=cpu`` runs the same pipeline as on GPUs with gloo ranks (torchrun, and mpirun
--oversubscribe) on tiny data. The whole smoke run takes minutes on a small machine, so it is
marked slow; the stages without training runs (data, contenders, all-to-all) run in the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu import run8_records, run8_report  # noqa: E402

SCRIPT = ROOT / "bench" / "gpu" / "run8.sh"
FIELDS = {"key", "contender", "model", "gpus", "batch", "samples_per_s", "val_auc",
          "bytes_per_sample", "launcher", "placement", "status", "machine", "command", "date"}  # fmt: skip


def run8(tmp: Path, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """``bash bench/gpu/run8.sh`` with DEVICE=cpu, tiny sizes, WORK under ``tmp``."""
    e = {**os.environ, "DEVICE": "cpu", "SMOKE": "1", "SKIP_BUILD": "1",
         "PYTHON": sys.executable, "WORK": str(tmp / "work"), **env}  # fmt: skip
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=ROOT, env=e, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def report_json(out: Path) -> dict:
    return json.loads((out / "run8.json").read_text())


def test_script_syntax_help_and_refusals(tmp_path: Path) -> None:
    for name in ("run8.sh", "run8_stages.sh"):
        assert subprocess.run(["bash", "-n", str(SCRIPT.parent / name)]).returncode == 0
    r = run8(tmp_path, "--help")
    assert r.returncode == 0 and "sweeps" in r.stdout and "SMOKE=1" in r.stdout
    r = run8(tmp_path, "--stage", "train,bogus")
    assert r.returncode == 2 and "unknown stage 'bogus'" in r.stderr
    r = run8(tmp_path, "--frobnicate")
    assert r.returncode == 2 and "unknown argument '--frobnicate'" in r.stderr
    r = run8(tmp_path, DEVICE="tpu")
    assert r.returncode == 2 and "DEVICE must be cuda or cpu" in r.stderr


def _cli(placement: str, gpus: int, batch: int, speed: float, nbytes: float, **kw) -> dict:
    return {"key": run8_records.cli_key(kw.get("launcher", "torchrun"), placement, gpus, batch, "wdl"),
            "contender": "hetgmp-cli", "launcher": kw.get("launcher", "torchrun"),
            "placement": placement, "gpus": gpus, "batch": batch, "model": "wdl",
            "samples_per_s": speed, "bytes_per_sample": nbytes, "val_auc": 0.77, "status": "ok",
            "store_rate": 0.01, "bound": 100}  # fmt: skip


def test_scaling_and_bytes_against_hash() -> None:
    recs = [
        _cli("whole", 1, 8192, 10e6, 0.0),
        _cli("plan", 8, 8192, 72e6, 120.0),
        _cli("plan", 8, 8192, 60e6, 120.0, launcher="mpirun"),
        _cli("hash", 8, 8192, 40e6, 900.0),
        {"key": "rowwise|torchrun|g8|b8192|wdl", "contender": "rowwise", "gpus": 8,
         "batch": 8192, "model": "wdl", "samples_per_s": 30e6, "bytes_per_sample": 1800.0,
         "val_auc": None, "status": "ok", "placement": "rowwise"},
    ]  # fmt: skip
    sc = {s["launcher"]: s for s in run8_report.scaling(recs, 8)}
    assert sc["torchrun"]["speedup"] == pytest.approx(7.2) and sc["torchrun"]["meets_target"]
    assert sc["mpirun"]["speedup"] == pytest.approx(6.0) and not sc["mpirun"]["meets_target"]
    assert sc["torchrun"]["target_speedup"] == pytest.approx(7.0)
    bh = {r["contender"] + r["placement"]: r for r in run8_report.bytes_vs_hash(recs, 8)}
    assert bh["hetgmp-clihash"]["x_hash"] == 1.0
    assert bh["hetgmp-cliplan"]["x_hash"] == pytest.approx(120 / 900)
    assert bh["rowwiserowwise"]["x_hash"] == pytest.approx(2.0)
    assert run8_report.scaling(recs, 1) == [] and run8_report.bytes_vs_hash(recs, 1) == []
    # a retried run: its latest record is the one reported, in its first position
    failed = {**recs[0], "status": "failed (exit 1)", "samples_per_s": None}
    assert run8_records.latest([failed, recs[1], recs[0]]) == [recs[0], recs[1]]


@pytest.mark.mpi
def test_run8_cpu_data_contenders_and_alltoall(tmp_path: Path) -> None:
    """The stages without CLI training on 2 gloo ranks: records of the all-to-all contenders."""
    out = tmp_path / "res"
    r = run8(tmp_path, "--out", str(out), STAGE="gen,contenders,nccl", RANKS="2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rep = report_json(out)
    assert rep["ranks"] == 2 and rep["device"] == "cpu"
    got = {(x["contender"], x["batch"]) for x in rep["records"]}
    assert got == {("rowwise", 128), ("tablewise", 128)}
    for x in rep["records"]:
        assert FIELDS <= set(x), FIELDS - set(x)
        assert x["gpus"] == 2 and x["model"] == "wdl" and x["val_auc"] is None
        assert x["samples_per_s"] > 0 and x["bytes_per_sample"] > 0
    # (the all-to-all benchmark's own checks ride on the stage's torchrun launch)
    a = rep["alltoall"]
    assert a["world"] == 2 and a["backend"] == "gloo" and len(a["results"]) == 2  # 0.25,1 MiB
    for rec in a["results"]:
        assert rec["bytes_per_rank"] % 8 == 0 and rec["time_ms"] > 0
        assert rec["busbw_gbs"] == pytest.approx(rec["algbw_gbs"] / 2)
    md = (out / "run8.md").read_text()
    assert "Throughput here is not meaningful" in md and "busbw" in md


@pytest.mark.slow
@pytest.mark.mpi
def test_run8_cpu_smoke_end_to_end_and_resume(tmp_path: Path) -> None:
    """Every stage on 2 gloo ranks (~2-4 minutes on 2 busy cores), then the same command again
    resumes (nothing is rerun), then 1 rank skips the N-rank stages with a message."""
    out = tmp_path / "res"
    r = run8(tmp_path, "--out", str(out), RANKS="2")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    rep = report_json(out)
    cli = {(x["launcher"], x["placement"], x["gpus"]): x for x in rep["records"]
           if x["contender"] == "hetgmp-cli"}  # fmt: skip
    assert set(cli) == {("torchrun", "whole", 1), ("torchrun", "plan", 2), ("mpirun", "plan", 2),
                        ("torchrun", "hash", 2)}  # fmt: skip
    for x in cli.values():
        assert FIELDS <= set(x) and x["status"] == "ok" and x["batch"] == 128
        assert 0.5 < x["val_auc"] < 1.0 and x["samples_per_s"] > 0
    assert cli[("torchrun", "whole", 1)]["bytes_per_sample"] == 0.0
    # the plan moves fewer bytes than hash placement at the same store rate and bound
    assert (
        cli[("torchrun", "plan", 2)]["bytes_per_sample"]
        < cli[("torchrun", "hash", 2)]["bytes_per_sample"]
    )
    assert {s["launcher"] for s in rep["scaling"]} == {"torchrun", "mpirun"}
    assert {x["contender"] for x in rep["records"]} == {"hetgmp-cli", "rowwise", "tablewise"}
    assert sorted(x["bound"] for x in rep["sweeps"]["staleness"]) == [0, 10, 100]
    assert sorted(x["store_rate"] for x in rep["sweeps"]["store_rate"]) == [0, 0.01, 0.1]
    for f in ("run8.md", "run8.png", "staleness.png", "store_rate.png", "store_rate.md"):
        assert (out / f).stat().st_size > 0, f
    again = run8(tmp_path, "--out", str(out), RANKS="2")
    assert again.returncode == 0 and again.stdout.count("|wdl: done before") == 4
    assert "contenders: done before" in again.stdout and "measured before" in again.stdout
    assert "exit 0 after" not in again.stdout.split("sweep")[0]  # no CLI or contender run again
    one = run8(tmp_path, "--out", str(tmp_path / "one"), RANKS="1", STAGE="plan,sweeps")
    assert one.returncode == 0, one.stdout[-3000:]
    assert "1 rank, no plan" in one.stdout and "sweeps: skipped (1 rank" in one.stdout
