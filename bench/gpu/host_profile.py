"""Is the training step bound by the host or by the GPU? A diagnosis of the CLI's steady
state::

    torchrun --nproc_per_node 2 bench/gpu/host_profile.py --out host_RANK.txt --skip 40 \
        --steps 60 -- --dataset DIR --device cuda --partition part.npz ...

For steps ``skip .. skip+steps`` it records, without the CUDA profiler (CUPTI slows graph
launches several times over, so a kernel trace cannot say this):

* the host's time per step (between the ends of consecutive training steps on the host) and
  the GPU's (between CUDA events recorded at those points, read after the run);
* how often the GPU had already finished the last step when the host ended this one
  step (``caught up``): near 100 % the GPU waits for the host (host-bound), near 0 % the host
  runs ahead (GPU-bound);
* with ``--cprofile``, the host's Python profile of those steps (by own time), which names
  where a host-bound step's time goes (graph launches, copies, bookkeeping).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.gpu.cli_hook import run_with_step_hook  # noqa: E402


class Recorder:
    """Host times, CUDA events and the caught-up count of the recorded steps."""

    def __init__(self, skip: int, steps: int, cprofile: bool) -> None:
        self.skip, self.steps, self.seen = skip, steps, 0
        self.host: list[float] = []
        self.events: list[torch.cuda.Event] = []
        self.caught_up = 0
        self.prof = cProfile.Profile() if cprofile else None

    def after_step(self) -> None:
        self.seen += 1
        i = self.seen - self.skip
        if i < 0 or i > self.steps or not torch.cuda.is_available():
            return
        if i == 0 and self.prof is not None:
            self.prof.enable()
        if self.events and self.events[-1].query():
            self.caught_up += 1
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.events.append(ev)
        self.host.append(time.perf_counter())
        if i == self.steps and self.prof is not None:
            self.prof.disable()

    def report(self, rows: int) -> str:
        if len(self.events) < 3:
            return f"no steps recorded: the run has fewer than {self.skip + 3} steps"
        self.events[-1].synchronize()
        host = [1e6 * (b - a) for a, b in zip(self.host, self.host[1:], strict=False)]
        gpu = [1e3 * a.elapsed_time(b) for a, b in zip(self.events, self.events[1:], strict=False)]
        n = len(self.events) - 1
        lines = [
            f"steps recorded: {len(host)}",
            f"host us/step: median {statistics.median(host):.1f}, mean {statistics.mean(host):.1f}",
            f"GPU us/step:  median {statistics.median(gpu):.1f}, mean {statistics.mean(gpu):.1f}",
            f"caught up (the GPU done with the last step when the host ended this one: "
            f"host-bound): {self.caught_up} of {n} ({self.caught_up / max(n, 1):.0%})",
        ]
        if self.prof is not None:
            buf = io.StringIO()
            stats = pstats.Stats(self.prof, stream=buf).sort_stats("tottime")
            stats.print_stats(rows)
            lines += ["", "host profile (cProfile, by own time; profiled steps run slower):"]
            lines.append(buf.getvalue())
        return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the report goes here (RANK: the local rank)")
    ap.add_argument("--skip", type=int, default=40, help="training steps before recording")
    ap.add_argument("--steps", type=int, default=60, help="training steps recorded")
    ap.add_argument("--rows", type=int, default=45, help="rows of the host profile")
    ap.add_argument("--cprofile", action="store_true", help="also profile the host (Python)")
    args, rest = ap.parse_known_args()
    cli_args = rest[1:] if rest[:1] == ["--"] else rest
    rec = Recorder(args.skip, args.steps, args.cprofile)
    return run_with_step_hook(cli_args, rec.after_step, lambda: rec.report(args.rows), args.out)


if __name__ == "__main__":
    sys.exit(main())
