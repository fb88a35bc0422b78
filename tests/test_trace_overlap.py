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


def test_timeline_lists_one_steps_operations_and_sums_them(tmp_path, capsys) -> None:
    """bench/gpu/trace_timeline.py: the operations inside one ProfilerStep range, in time,
    with short names, and their time per name."""
    from bench.gpu.trace_timeline import main as timeline_main
    from bench.gpu.trace_timeline import short_name, timeline

    def step(n: int, ts: float) -> dict[str, object]:
        return {"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{n}", "ts": ts,
                "dur": 100}  # fmt: skip

    events = [step(1, 0), step(2, 100), step(3, 200),
              _k("void at::native::take_rows_kernel<float>(int, float*)", 110, 20),
              _k("scatter_add_fields_kernel", 140, 30), _k("take_rows_kernel", 175, 5),
              _k("Memcpy DtoD", 250, 4, cat="gpu_memcpy"), _k("other", 10, 5)]  # fmt: skip
    assert short_name("void ns::a::foo<int, 3>(float*, int)") == "foo"
    text = timeline(events)  # (the middle step: 2)
    lines = text.splitlines()
    assert lines[0] == "step 2: 100.0 us, 3 GPU operations"
    assert [ln.split()[-1] for ln in lines[2:5]] == ["take_rows_kernel",
                                                      "scatter_add_fields_kernel",
                                                      "take_rows_kernel"]  # fmt: skip
    assert lines[2].split()[:2] == ["10.0", "20.0"]
    summed = lines[lines.index(next(ln for ln in lines if "summed" in ln)) + 1 :]
    assert summed[0].split() == ["30.0", "scatter_add_fields_kernel"]
    assert summed[1].split() == ["25.0", "take_rows_kernel"]
    assert "step 3: 100.0 us, 1 GPU operations" in timeline(events, step=3)
    # (one stream, three kernels: busy 55 us from 10 to 80; the union the same)
    assert "GPU busy (any stream): 55.0 us" in text, text
    assert next(ln for ln in lines if ln.strip().startswith("?")).split() == [
        "?", "3", "55.0", "10.0", "80.0"]  # fmt: skip
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert timeline_main([str(path), "--step", "1", "--out", str(tmp_path / "o.txt")]) == 0
    assert (tmp_path / "o.txt").read_text().startswith("step 1: 100.0 us, 1 GPU operations")
    capsys.readouterr()
