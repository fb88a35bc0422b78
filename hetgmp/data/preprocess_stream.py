"""Reading side of :func:`hetgmp.data.preprocess.preprocess`: row sources, prefetch, progress.

:class:`RowSource` is what a reader provides; :func:`source_blocks` streams the blocks of all
sources through a background :func:`prefetch` thread while :class:`Progress` reports bytes and
rows (a bar on a terminal, one parseable log line per interval).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from hetgmp.data.bad_lines import BadLineReport
from hetgmp.data.delimited_spec import RawBlock
from hetgmp.progress import auto_unless_off, bar_wanted

# The preprocess logger: lines keep their logger name whichever module writes them.
log = logging.getLogger("hetgmp.preprocess")
_LOG_INTERVAL_S = 10.0
_PREFETCH_BLOCKS = 1


class RowSource(Protocol):
    """What a reader provides to :func:`preprocess`."""

    paths: list[Path]

    @property
    def field_names(self) -> list[str]: ...

    @property
    def dense_names(self) -> list[str]: ...

    @property
    def total_bytes(self) -> int: ...

    def describe(self) -> dict[str, Any]: ...

    def iter_blocks(
        self, report: BadLineReport, progress: Callable[[int], None] | None = None
    ) -> Iterator[RawBlock]: ...


class Progress:
    """A tqdm bar over input bytes (``unit="B"``) or rows, plus one parseable log line per
    interval: ``bytes=`` only where bytes are counted (pass 1), ``rows=`` always."""

    def __init__(self, total: int, desc: str, enabled: bool, unit: str = "B") -> None:
        self.desc = desc
        self.unit = unit
        self.bar = tqdm(
            total=total,
            unit=unit,
            unit_scale=True,
            desc=desc,
            disable=not bar_wanted(auto_unless_off(enabled)),
        )
        self.t0 = self.last = time.perf_counter()
        self.bytes = 0
        self.rows = 0

    def bytes_done(self, n: int) -> None:
        self.bytes += n
        self.bar.update(n)

    def advance(self, n: int) -> None:
        """Move a bar counted in rows (pass 2) by ``n``."""
        self.bar.update(n)

    def rows_done(self, n: int) -> None:
        self.rows += n
        now = time.perf_counter()
        if now - self.last >= _LOG_INTERVAL_S:
            self.last = now
            log.info(self.line())

    def line(self) -> str:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        read = f"bytes={self.bytes} " if self.unit == "B" else ""
        return (
            f"preprocess {self.desc} {read}rows={self.rows} "
            f"elapsed_s={dt:.1f} rows_per_s={self.rows / dt:.0f}"
        )

    def close(self) -> float:
        self.bar.close()
        return time.perf_counter() - self.t0


def source_blocks(
    sources: list[tuple[str, RowSource]], report: BadLineReport, prog: Progress
) -> Iterator[tuple[str, int, RawBlock]]:
    def produce() -> Iterator[tuple[str, int, RawBlock]]:
        for role, src in sources:
            file_index = {str(p): i for i, p in enumerate(src.paths)}
            for block in src.iter_blocks(report, prog.bytes_done):
                yield role, file_index.get(block.path, 0), block

    for item in prefetch(produce()):
        prog.rows_done(len(item[2]))
        yield item


_END = object()


def prefetch(it: Iterator[Any], depth: int = _PREFETCH_BLOCKS) -> Iterator[Any]:
    """Run ``it`` in a background thread, ``depth`` items ahead of the consumer.

    Reading and parsing the next block (pyarrow, GIL released) then overlaps with counting or
    id mapping of the current one (numpy); memory grows by at most ``depth`` blocks. An
    exception in ``it`` is re-raised here, in order; when the consumer stops early the thread
    is told to stop and joined.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in it:
                if not put((item, None)):
                    return
            put((_END, None))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            put((_END, err))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=run, name="hetgmp-preprocess-reader", daemon=True)
    thread.start()
    try:
        while True:
            item, err = q.get()
            if err is not None:
                raise err
            if item is _END:
                return
            yield item
    finally:
        stop.set()
        thread.join()
