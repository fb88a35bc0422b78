"""bench/gpu/trace_overlap.py: the share of collective time hidden under other kernels, and
the GPU's idle time, from Chrome-trace events (the GPU profile's diagnosis)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu.trace_overlap import main, merged, overlap  # noqa: E402


def _k(name: str, ts: float, dur: float, cat: str = "kernel") -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_overlap_counts_hidden_collective_time_and_idle_gaps(tmp_path, capsys) -> None:
    events = [
        _k("ncclDevKernel_SendRecv(x)", 0, 10),  # half under the gemm below
        _k("gemm", 5, 10),
        _k("adam", 12, 3),  # (overlaps the gemm: counted once)
        _k("ncclDevKernel_AllReduce(x)", 30, 10),  # after a 15 us gap, alone
        _k("cpu_op", 0, 100, cat="cpu_op"),  # not a GPU event
    ]
    o = overlap(events)
    assert o["window_us"] == 40 and o["comm_us"] == 20 and o["hidden_us"] == 5
    assert o["hidden_share"] == 0.25 and o["idle_us"] == 15
    assert merged([(3, 4), (0, 2), (1, 3)]) == [(0, 4)]
    assert overlap([])["comm_us"] == 0
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert main([str(path)]) == 0
    assert "hidden under compute 25%" in capsys.readouterr().out
