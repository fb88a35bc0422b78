"""A diagnosis (not a benchmark figure): the user's training command under ``torch.profiler``,
one table per rank of where the host and the GPU spend a step's time.

    torchrun --nproc_per_node 2 bench/gpu/async_trace.py --out DIR -- TRAIN_ARGS...

``TRAIN_ARGS`` are ``examples/hetuctr.py``'s. Each rank profiles its whole run (CPU ops of
every thread, the service's included, and CUDA kernels) and writes ``DIR/trace_rank{r}.txt``:
the ops by total host time (synchronizations show as ``cudaStreamSynchronize``,
``cudaEventSynchronize`` and blocking ``cudaMemcpy*``) and by GPU time; with ``--examine
OP[,OP]`` also the slowest calls of those ops and what ran inside and beside them. The profiler
slows the host side; read the shares, not the milliseconds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from hetgmp.config import add_arguments, from_namespace  # noqa: E402
from hetgmp.train import run as run_mod  # noqa: E402
from hetgmp.train.config import TrainConfig  # noqa: E402


def main() -> None:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rows", type=int, default=40)
    p.add_argument(
        "--examine", default="", help="op names (comma): what their slowest calls overlap"
    )
    p.add_argument(
        "--dump",
        action="store_true",
        help="also write the chrome trace, gzipped (DIR/trace_rank{r}.json.gz: bench/trace_threads.py)",
    )
    a = p.parse_args(argv[:cut])
    tp = argparse.ArgumentParser()
    add_arguments(tp, TrainConfig)
    cfg = from_namespace(TrainConfig, tp.parse_args(argv[cut + 1 :]))
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    try:
        from torch._C._profiler import _ExperimentalConfig

        extra = {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError):  # (another torch: the main thread only)
        extra = {}
    with profile(activities=activities, **extra) as prof:
        run_mod.run(cfg)
    rank = int(__import__("os").environ.get("RANK", "0"))
    a.out.mkdir(parents=True, exist_ok=True)
    ka = prof.key_averages()
    text = [f"rank {rank}: {' '.join(argv[cut + 1 :])}", "", "by host time (total):"]
    text.append(ka.table(sort_by="cpu_time_total", row_limit=a.rows))
    if torch.cuda.is_available():
        text += ["", "by GPU time:", ka.table(sort_by="cuda_time_total", row_limit=a.rows)]
    if a.examine or a.dump:
        chrome = Path(f"/tmp/hetgmp-trace-{rank}.json")
        prof.export_chrome_trace(str(chrome))
        if a.dump:
            with gzip.open(a.out / f"trace_rank{rank}.json.gz", "wb") as f:
                f.write(chrome.read_bytes())
        trace = json.loads(chrome.read_text())
        for name in a.examine.split(","):
            text += ["", *examine(trace, name)]
    (a.out / f"trace_rank{rank}.txt").write_text("\n".join(text))


def examine(trace: dict, name: str, calls: int = 8, top: int = 8) -> list[str]:
    """The ``calls`` slowest host calls of op ``name`` in the middle half of the run, and for
    each the longest events inside it on its thread and overlapping it on the others."""
    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    hits = sorted((e for e in ev if e.get("name") == name), key=lambda e: e["ts"])
    mid = hits[len(hits) // 4 : 3 * len(hits) // 4]
    out = [f"{name}: {len(hits)} calls; the slowest {calls} of the middle half:"]
    for h in sorted(mid, key=lambda e: -e["dur"])[:calls]:
        t0, t1, tid = h["ts"], h["ts"] + h["dur"], h.get("tid")
        out.append(f"  {h['dur']:.0f} us on thread {tid}")
        inner, other = [], []
        for e in ev:
            lo, hi = max(t0, e["ts"]), min(t1, e["ts"] + e["dur"])
            if hi <= lo or e is h or e["name"].startswith("PyTorch Profiler"):
                continue
            (inner if e.get("tid") == tid else other).append((hi - lo, e))
        for label, group in (("inside", inner), ("other threads", other)):
            for ov, e in sorted(group, key=lambda x: -x[0])[:top]:
                out.append(f"    {label}: {ov:7.0f} us of {e['name'][:70]} (tid {e.get('tid')})")
    return out


if __name__ == "__main__":
    main()
