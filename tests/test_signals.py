"""SIGTERM is handled like Ctrl-C (no hidden temp directory stays), and a later run of the same
output removes what a harder kill left (issue 31, item 8). Real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hetgmp.cli import main as cli_main
from hetgmp.signals import remove_stale_temps, temp_name

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _wait_for(pred, what: str, proc: subprocess.Popen, limit_s: float = 40.0) -> None:
    deadline = time.monotonic() + limit_s
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"the process ended before {what}: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no {what} within {limit_s} s")
        time.sleep(0.05)


def _temps(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.tmp-*"))


def test_sigterm_mid_write_leaves_no_temp(tmp_path: Path) -> None:
    out = tmp_path / "big"
    argv = ["generate", "criteo-like", "--out", str(out), "--num-samples", "20000000",
            "--workers", "1", "--no-progress"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetgmp", *argv], env=_env(), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # wait until the writer has its hidden directory and has put rows in it
    _wait_for(lambda: any(p.stat().st_size > 0 for t in _temps(out) for p in t.rglob("*.npy")),
              "rows in a temp directory", proc)  # fmt: skip
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=40)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "terminated (SIGTERM)" in err
    assert "Traceback" not in err
    assert _temps(out) == [] and not out.exists()


def test_a_later_run_removes_dead_writers_temps(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = tmp_path / f".ds.tmp-{int(dead.stdout)}-0badcafe"  # its writer is gone
    legacy = tmp_path / ".ds.tmp-1a2b3c4d"  # the name before pids were in it
    live = temp_name(out)  # this (running) process's: another writer at work, kept
    for d in (stale, legacy, live):
        (d / "train").mkdir(parents=True)
        (d / "train" / "sparse.npy").write_bytes(b"x" * 1000)
    other = tmp_path / ".dsx.tmp-1a2b3c4d"  # another output's: not ours to remove
    other.mkdir()
    assert cli_main(["generate", "criteo-like", "--out", str(out), "--num-samples", "2000",
                     "--no-progress"]) == 0  # fmt: skip
    assert _temps(out) == [live]
    assert other.exists() and out.is_dir()
    assert remove_stale_temps(out) == []  # (the live one stays while its writer runs)


def test_sigterm_stops_training_like_ctrl_c(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    assert cli_main(["generate", "criteo-like", "--out", str(ds), "--num-samples", "4000",
                     "--no-progress"]) == 0  # fmt: skip
    log = tmp_path / "log.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetgmp", "train", "--dataset", str(ds), "--iter", "1000000",
         "--batch-size", "16", "--log-every", "1", "--log-json", str(log), "--no-progress",
         "--threads", "1"],
        env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _wait_for(lambda: log.exists() and '"train"' in log.read_text(), "a training step", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=40)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "terminated (SIGTERM)" in err and "Traceback" not in err
