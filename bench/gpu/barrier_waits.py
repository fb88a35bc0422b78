"""How long each rank spends inside each of the step's meetings with the other ranks (issue 30),
a diagnosis of the CLI's steady state::

    torchrun --nproc_per_node 2 bench/gpu/barrier_waits.py --out waits_RANK.txt --skip 40 \
        --every 10 -- --dataset DIR --device cuda --partition part.npz ...

Why: in session 17 cutting both paths after backward moved the 2-GPU step by nothing, though a
kernel timeline under CUPTI put them on its critical path (``docs/scaling_plan.md``). If the
step is *peer-bound* (at each meeting the earlier rank waits for the later, and which rank is
later changes with each batch), the time inside the meetings says so: a device barrier alone
takes ~5 us, NCCL's all-reduce of the dense gradients ~36 us on 2 H100s; the rest is waiting.

How: while a CUDA graph is captured, every meeting (``PeerMemory.barrier``: the exchange's
payload barriers and the counts phase's, the sizes exchange, the dense gradients' sum) is
wrapped in two CUDA events made with ``external=True``, which a captured graph records at each
replay; after every ``--every``-th training step past ``--skip`` the host waits for the device
and reads each pair's time (that of the pair's last replay: each graph holds its own pairs).
Waiting for the device every k-th step lets the ranks start that step together, so the waits
seen are those made inside a step. Writes per meeting (by the calling function and channel):
pairs, samples, median and 90th percentile microseconds.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.gpu.cli_hook import reading_parser, run_reading  # noqa: E402
from hetgmp.comm.peer_memory import PeerMemory  # noqa: E402
from hetgmp.embedding.padded import buffers  # noqa: E402
from hetgmp.train import dense_sync  # noqa: E402


class Waits:
    """The event pairs made while capturing, and the times read from them."""

    def __init__(self) -> None:
        self.pairs: list[tuple[str, Any, Any]] = []
        self.times: dict[str, list[float]] = defaultdict(list)

    def timed(self, label: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` between two recorded external events when a graph is being captured."""
        if not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            return fn()
        start = torch.cuda.Event(enable_timing=True, external=True)
        end = torch.cuda.Event(enable_timing=True, external=True)
        start.record()
        out = fn()
        end.record()
        self.pairs.append((label, start, end))
        return out

    def read(self) -> None:
        torch.cuda.synchronize()
        for label, start, end in self.pairs:
            try:
                self.times[label].append(1e3 * start.elapsed_time(end))
            except RuntimeError:  # (a pair whose graph has not replayed yet)
                continue

    def report(self) -> str:
        lines = [f"{'meeting':<46} {'pairs':>5} {'samples':>7} {'median us':>9} {'p90 us':>7}"]
        for label in sorted(self.times):
            t = sorted(self.times[label])
            pairs = sum(1 for p in self.pairs if p[0] == label)
            p90 = t[min(len(t) - 1, int(0.9 * len(t)))]
            lines.append(f"{label:<46} {pairs:>5} {len(t):>7} {statistics.median(t):>9.1f} "
                         f"{p90:>7.1f}")  # fmt: skip
        return "\n".join(lines) if self.times else "no meeting timed (no CUDA graph captured)"


def _caller() -> str:
    f = sys._getframe(2)
    return f"{f.f_code.co_name} ({Path(f.f_code.co_filename).stem})"


def install(w: Waits) -> None:
    """Wrap the meetings (module docstring)."""
    barrier, exchange, dense = PeerMemory.barrier, buffers.exchange_fixed, dense_sync.GradBucket
    dense_sum = dense.all_reduce

    def peer_barrier(self: PeerMemory, channel: int = 0) -> None:
        w.timed(f"barrier ch{channel}: {_caller()}", lambda: barrier(self, channel))

    def sizes(*a: Any, **kw: Any) -> Any:
        return w.timed(f"all-to-all: {a[-1] if a else ''}", lambda: exchange(*a, **kw))

    def dense_all_reduce(self: Any) -> None:
        w.timed("dense gradients' sum", lambda: dense_sum(self))

    PeerMemory.barrier = peer_barrier  # type: ignore[method-assign]
    buffers.exchange_fixed = sizes
    dense.all_reduce = dense_all_reduce  # type: ignore[method-assign]


def main() -> int:
    args, rest = reading_parser(__doc__).parse_known_args()
    w = Waits()
    install(w)
    return run_reading(args, rest, w.read, w.report)


if __name__ == "__main__":
    sys.exit(main())
