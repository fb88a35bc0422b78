"""GPU time per training step, kernel by kernel, of the CLI's steady state (CUDA graph
replays included: CUPTI reports the kernels a replayed graph runs), a diagnosis::

    torchrun --nproc_per_node 2 bench/gpu/profile_steps.py --out prof_RANK.txt --skip 30 \
        --steps 20 -- --dataset DIR --device cuda --partition part.npz ...

``RANK`` in ``--out`` becomes the local rank. Only steps ``skip+2 .. skip+2+steps`` are
recorded (a schedule stepped after every training step), so start-up, warm-up, capture and
evaluation stay out. Writes the kernels sorted by GPU time per step (and calls per step) and
the sum, which exceeds the step's wall time where kernels overlap (NCCL on its own stream).
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402

from bench.gpu.trace_overlap import overlap, read_trace  # noqa: E402
from hetgmp.train import trainer as trainer_module  # noqa: E402
from hetgmp.train.cli import main as cli_main  # noqa: E402


def _table(prof: profile, steps: int, rows: int) -> str:
    events = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    events.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in events) / 1e3 / steps
    lines = [f"GPU time per step (sum of kernels, {steps} steps): {total:.3f} ms", "",
             f"{'ms/step':>9} {'calls/step':>10}  kernel"]  # fmt: skip
    for e in events[:rows]:
        ms = e.self_device_time_total / 1e3 / steps
        lines.append(f"{ms:9.4f} {e.count / steps:10.2f}  {e.key[:110]}")
    return "\n".join(lines)


def _export(prof: profile, path: str) -> None:
    """The Chrome trace, gzipped (a few MB for a few steps)."""
    raw = Path(path).with_suffix("")
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as f, gzip.open(path, "wb") as g:
        g.write(f.read())
    raw.unlink()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the table goes here (RANK: the local rank)")
    ap.add_argument("--skip", type=int, default=30, help="training steps before recording")
    ap.add_argument("--steps", type=int, default=20, help="training steps recorded")
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument(
        "--trace",
        help="also a gzipped Chrome trace of the recorded steps here "
        "(RANK: the local rank), to read the order and the gaps",
    )
    args, rest = ap.parse_known_args()
    cli_args = rest[1:] if rest[:1] == ["--"] else rest
    sched = schedule(wait=args.skip, warmup=2, active=args.steps, repeat=1)
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=acts, schedule=sched) as prof:
        run = trainer_module.Trainer._run_step

        def stepped(self, *a, **kw):  # type: ignore[no-untyped-def]
            run(self, *a, **kw)
            prof.step()

        trainer_module.Trainer._run_step = stepped  # type: ignore[method-assign]
        rc = cli_main(cli_args)
    try:
        text = _table(prof, args.steps, args.rows)
    except AssertionError:  # (the run ended before the recorded steps)
        text = f"no step recorded: the run has fewer than {args.skip + 2 + args.steps} steps"
    rank = os.environ.get("LOCAL_RANK", "0")
    if args.trace:
        path = args.trace.replace("RANK", rank)
        _export(prof, path)
        o = overlap(read_trace(Path(path)))  # (the recorded steps' collectives and gaps)
        text += (f"\ncollectives {o['comm_us'] / args.steps:.1f} us/step, hidden under compute "
                 f"{o['hidden_share']:.0%}; GPU idle {o['idle_us'] / args.steps:.1f} us/step")  # fmt: skip
    out = Path(args.out.replace("RANK", rank))
    out.write_text(text + "\n")
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
