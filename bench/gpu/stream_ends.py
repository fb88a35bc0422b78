"""When each stream of the captured step reaches each of its joins, from the step's start, and
so which stream ends the step (issue 30, a diagnosis of the CLI's steady state, no CUPTI)::

    torchrun --nproc_per_node 2 bench/gpu/stream_ends.py --out ends_RANK.txt --skip 40 \
        --every 10 -- --dataset DIR --device cuda --partition part.npz ...

Why: a delay after the 2-GPU step's main stream cost the step 28 of 38 us
(``bench/results/gpu/rank_delays_s19/``): some other stream's work ends after it, and every cut
of the tail since session 14 measured within ~1 %. A kernel timeline under CUPTI slows graph
launches and shows only the rank that waited for nobody; external CUDA events inside the
captured graph time the real step.

How: while a CUDA graph is captured, the start of the capture, every ``torch.cuda.Event``
recorded (each join of one stream into another: ``wait_stream`` records one on the stream
joined) and the end of the capture (after every stream joined its origin) each get an
external timing event on the same stream, labelled by the first caller outside torch; so do
the points of ``dilations.py`` (``--points``: ``POINT <`` before, ``POINT >`` after: the rows'
gradient sum, pack, finish, the dense sum, Adam, ...), on the stream current there. After
every ``--every``-th training step past ``--skip`` the host waits for the device and reads,
for the graph that replayed last, each event's time from the capture's start: when that
stream's work up to that point had finished. Writes per event: samples, median and 90th
percentile microseconds from the start, sorted by median, the step's end last.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.gpu.cli_hook import reading_parser, run_reading  # noqa: E402
from bench.gpu.dilations import POINTS, hook  # noqa: E402

END = "(the step's end: every stream joined)"


class Ends:
    """Each captured graph's external events (its start first), and the times read."""

    def __init__(self) -> None:
        self.graphs: list[list[tuple[str, Any]]] = []
        self.current: list[tuple[str, Any]] | None = None
        self.last_seen: dict[int, float] = {}
        self.ref: Any = None  # (an event outside the graphs: when a graph's start last ran)
        self.times: dict[str, list[float]] = defaultdict(list)
        self.raw_record: Any = torch.cuda.Event.record  # (unwrapped: install wraps it)

    def mark(self, label: str, stream: Any = None) -> None:
        """An external timing event on ``stream`` (the current one) while capturing."""
        if self.current is None or not torch.cuda.is_current_stream_capturing():
            return
        ev = torch.cuda.Event(enable_timing=True, external=True)
        self.raw_record(ev, stream)
        self.current.append((label, ev))

    def read(self) -> None:
        """The times of the graphs that replayed since the last read (a graph that did not
        keeps its old events: its start, timed from a fixed event, has not moved)."""
        torch.cuda.synchronize()
        if self.ref is None:
            self.ref = torch.cuda.Event(enable_timing=True)
            self.raw_record(self.ref, None)
            torch.cuda.synchronize()
        for i, events in enumerate(self.graphs):
            if len(events) < 2:
                continue
            start = events[0][1]
            try:
                when = self.ref.elapsed_time(start)
                start.elapsed_time(events[-1][1])
            except RuntimeError:  # (not replayed yet)
                continue
            if self.last_seen.get(i) == when:
                continue
            self.last_seen[i] = when
            seen: dict[str, int] = defaultdict(int)
            for label, ev in events[1:]:
                seen[label] += 1
                key = label if seen[label] == 1 else f"{label} #{seen[label]}"
                self.times[key].append(1e3 * start.elapsed_time(ev))

    def report(self) -> str:
        if not self.times:
            return "no event timed (no CUDA graph captured)"
        rows = sorted(self.times.items(), key=lambda kv: statistics.median(kv[1]))
        lines = [f"{'event (us from the step start)':<72} {'samples':>7} {'median':>7} {'p90':>7}"]
        for label, t in rows:
            t = sorted(t)
            p90 = t[min(len(t) - 1, int(0.9 * len(t)))]
            lines.append(f"{label[:72]:<72} {len(t):>7} {statistics.median(t):>7.1f} {p90:>7.1f}")
        return "\n".join(lines)


def _caller() -> str:
    """The first frame outside torch and this file: ``function (file:line)``."""
    f = sys._getframe(2)
    while f is not None and ("/torch/" in f.f_code.co_filename or f.f_code.co_filename == __file__):
        f = f.f_back  # type: ignore[assignment]
    if f is None:
        return "?"
    return f"{f.f_code.co_name} ({Path(f.f_code.co_filename).stem}:{f.f_lineno})"


def install(e: Ends) -> None:
    """Wrap the capture's start and end and every event record (module docstring)."""
    graph_cls, event_cls = torch.cuda.graphs.graph, torch.cuda.Event
    enter, leave, record = graph_cls.__enter__, graph_cls.__exit__, event_cls.record
    e.raw_record = record

    def entered(self: Any) -> Any:
        out = enter(self)
        e.current = []
        e.graphs.append(e.current)
        e.mark("(start)")
        return out

    def left(self: Any, *exc: Any) -> Any:
        e.mark(END)
        e.current = None
        return leave(self, *exc)

    def recorded(self: Any, stream: Any = None) -> None:
        # (the mark first: the event recorded after it is what a join waits for, so the mark
        # is joined too; a mark after the last join of a stream is work a capture refuses)
        e.mark(f"record: {_caller()}", stream)
        record(self, stream)

    graph_cls.__enter__ = entered  # type: ignore[method-assign]
    graph_cls.__exit__ = left  # type: ignore[method-assign]
    event_cls.record = recorded  # type: ignore[method-assign]


def install_points(e: Ends, points: list[str]) -> None:
    """Marks before and after each of ``points`` (``dilations.POINTS``)."""
    for point in points:
        before = None if point == "end" else (lambda p=point: e.mark(f"{p} <"))
        hook(point, before, lambda p=point: e.mark(f"{p} >"))


def main() -> int:
    ap = reading_parser(__doc__)
    ap.add_argument("--points", default=",".join(POINTS), help="dilations.py's points to mark")
    args, rest = ap.parse_known_args()
    e = Ends()
    install(e)
    install_points(e, [p for p in args.points.split(",") if p])
    return run_reading(args, rest, e.read, e.report)


if __name__ == "__main__":
    sys.exit(main())
