"""Two-pass streaming preprocessing of any row source into the hetgmp dataset format.

Pass 1 reads every input block, validates it and counts raw categorical keys per field
(:class:`~hetgmp.data.vocab.KeyCounter`); the vocabulary (contiguous ids per field, a shared
*rare* id below ``min_count``, fields laid out one after another in the global id space) is
then fixed. Pass 2 reads the input again, maps keys to global ids and streams rows into a
:class:`~hetgmp.data.format.DatasetWriter`, which renames its temporary directory into place
only at the end: a failure never leaves an output directory that looks complete.

Memory is bounded by one block plus the vocabulary, whatever the input size. Counts are made
over all inputs (train and test files alike, as DLRM does for Criteo), so every value has an id.

Train/test split (``split``): ``tail`` puts the last ``test_fraction`` of the valid rows in test
(Criteo logs are in time order, so this is a forward-in-time holdout); ``random`` puts a row in
test when ``splitmix64(seed, file index, line number)`` falls below ``test_fraction`` (a pure
function of the line's position). With separate test files, all their rows go to test.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from hetgmp.data.bad_lines import BadInputError, BadLineReport
from hetgmp.data.delimited import RawBlock
from hetgmp.data.format import Dataset, DatasetWriter, make_fields
from hetgmp.data.vocab import ID_ORDERS, FieldVocab, KeyCounter, build_vocab, splitmix64

log = logging.getLogger("hetgmp.preprocess")
SPLIT_MODES = ("tail", "random")
_LOG_INTERVAL_S = 10.0
_PREFETCH_BLOCKS = 1
_MAP_THREADS = 2
_U32_MAX = np.uint64(2**32 - 1)


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


@dataclasses.dataclass
class PreprocessOptions:
    """How raw values become ids and rows become splits (see the module docstring)."""

    min_count: int = 1
    id_order: str = "frequency"
    test_fraction: float = 0.1
    split: str = "tail"
    seed: int = 0
    on_bad_line: str = "error"
    progress: bool = True
    name: str = ""
    overwrite: bool = False

    def check(self) -> None:
        if self.min_count < 1:
            raise ValueError(f"--min-count must be >= 1, got {self.min_count}")
        if self.id_order not in ID_ORDERS:
            raise ValueError(f"--id-order {self.id_order!r} is not one of {ID_ORDERS}")
        if not 0.0 <= self.test_fraction < 1.0:
            raise ValueError(f"--test-fraction must be in [0, 1), got {self.test_fraction}")
        if self.split not in SPLIT_MODES:
            raise ValueError(f"--split {self.split!r} is not one of {SPLIT_MODES}")
        BadLineReport(self.on_bad_line)


class _Progress:
    """A tqdm bar over input bytes plus one parseable log line per interval."""

    def __init__(self, total: int, desc: str, enabled: bool, unit: str = "B") -> None:
        self.desc = desc
        self.bar = tqdm(
            total=total,
            unit=unit,
            unit_scale=True,
            desc=desc,
            disable=not (enabled and sys.stderr.isatty()),
        )
        self.t0 = self.last = time.perf_counter()
        self.bytes = 0
        self.rows = 0

    def bytes_done(self, n: int) -> None:
        self.bytes += n
        self.bar.update(n)

    def rows_done(self, n: int) -> None:
        self.rows += n
        now = time.perf_counter()
        if now - self.last >= _LOG_INTERVAL_S:
            self.last = now
            log.info(self.line())

    def line(self) -> str:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        return (
            f"preprocess {self.desc} bytes={self.bytes} rows={self.rows} "
            f"elapsed_s={dt:.1f} rows_per_s={self.rows / dt:.0f}"
        )

    def close(self) -> float:
        self.bar.close()
        return time.perf_counter() - self.t0


class _Spill:
    """Pass-1 blocks (keys, dense, labels) in an anonymous temporary file, read by pass 2.

    The input is parsed once: pass 2 only maps the spilled keys to ids. Memory stays one block;
    the file (next to the output, deleted on close or crash) takes about 4 bytes per key plus
    4 per dense value and label, less than the text. Keys that all fit are stored as
    ``key + 1`` in uint32 (so the missing key ``2**64 - 1`` becomes 0), others as uint64.
    """

    def __init__(self, directory: Path, *, keep_lines: bool) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.f = tempfile.TemporaryFile(prefix=".hetgmp-preprocess-spill-", dir=directory)
        self.keep_lines = keep_lines
        self.index: list[tuple[str, int, str, int, int, bool, bool]] = []

    def put(self, role: str, file_index: int, block: RawBlock) -> None:
        n = len(block)
        keys = block.keys
        with np.errstate(over="ignore"):
            shifted = keys + np.uint64(1)
        small = keys.size == 0 or bool(shifted.max() <= _U32_MAX)
        parts = [shifted.astype(np.uint32) if small else keys, block.labels.astype(np.float32)]
        if block.dense is not None:
            parts.append(block.dense.astype(np.float32, copy=False))
        if self.keep_lines:
            parts.append(block.lines.astype(np.int64, copy=False))
        for a in parts:
            self.f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
        self.index.append(
            (role, file_index, block.path, n, keys.shape[1], small, block.dense is not None)
        )

    def _read(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        a = np.empty(shape, dtype=dtype)
        if a.nbytes and self.f.readinto(memoryview(a).cast("B")) != a.nbytes:
            raise RuntimeError("preprocess spill file is truncated")
        return a

    def blocks(self, num_dense: int) -> Iterator[tuple[str, int, RawBlock]]:
        self.f.flush()
        self.f.seek(0)
        for role, file_index, path, n, nf, small, has_dense in self.index:
            if small:
                with np.errstate(over="ignore"):
                    keys = self._read((n, nf), np.uint32).astype(np.uint64) - np.uint64(1)
            else:
                keys = self._read((n, nf), np.uint64)
            labels = self._read((n,), np.float32)
            dense = self._read((n, num_dense), np.float32) if has_dense else None
            lines = self._read((n,), np.int64) if self.keep_lines else np.zeros(0, np.int64)
            yield role, file_index, RawBlock(path, lines, labels, dense, keys)

    def close(self) -> None:
        self.f.close()


def random_split_mask(seed: int, file_index: int, lines: np.ndarray, fraction: float) -> np.ndarray:
    """True where a line goes to test: a pure function of (seed, file index, line number)."""
    x = (lines.astype(np.uint64) + (np.uint64(file_index) << np.uint64(40))) ^ splitmix64(
        np.array([seed], dtype=np.uint64)
    )[0]
    u = (splitmix64(x) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return u < fraction


def _sources_blocks(
    sources: list[tuple[str, RowSource]], report: BadLineReport, prog: _Progress
) -> Iterator[tuple[str, int, RawBlock]]:
    def produce() -> Iterator[tuple[str, int, RawBlock]]:
        for role, src in sources:
            file_index = {str(p): i for i, p in enumerate(src.paths)}
            for block in src.iter_blocks(report, prog.bytes_done):
                yield role, file_index.get(block.path, 0), block

    for item in _prefetch(produce()):
        prog.rows_done(len(item[2]))
        yield item


_END = object()


def _prefetch(it: Iterator[Any], depth: int = _PREFETCH_BLOCKS) -> Iterator[Any]:
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


def preprocess(
    source: RowSource,
    out: str | Path,
    options: PreprocessOptions | None = None,
    *,
    test_source: RowSource | None = None,
) -> Dataset:
    """Read ``source`` (and ``test_source``) twice and write a dataset directory at ``out``."""
    opt = options or PreprocessOptions()
    opt.check()
    if test_source is not None and test_source.field_names != source.field_names:
        raise ValueError("the test files have different categorical columns than the train files")
    sources: list[tuple[str, RowSource]] = [("train", source)]
    if test_source is not None:
        sources.append(("test", test_source))
    total_bytes = sum(s.total_bytes for _, s in sources)
    field_names = source.field_names
    num_fields = len(field_names)
    num_dense = len(source.dense_names)

    # Pass 1: parse, validate and count; the parsed blocks go to a spill file for pass 2.
    report = BadLineReport(opt.on_bad_line, unit=getattr(source, "unit", "line"))
    counter = KeyCounter(num_fields, track_first=opt.id_order == "first-appearance")
    rows_in = {"train": 0, "test": 0}
    keep_lines = test_source is None and opt.split == "random" and opt.test_fraction > 0.0
    spill = _Spill(Path(out).resolve().parent, keep_lines=keep_lines)
    try:
        prog = _Progress(total_bytes, "pass 1/2 (count)", opt.progress)
        for role, file_index, block in _sources_blocks(sources, report, prog):
            counter.add(block.keys)
            spill.put(role, file_index, block)
            rows_in[role] += len(block)
        t_pass1 = prog.close()
        log.info(prog.line())
        if rows_in["train"] == 0:
            where = ", ".join(str(p) for p in source.paths)
            raise BadInputError(f"{where}: no valid data rows ({report.summary()})")

        vocabs: list[FieldVocab] = []
        for f in range(num_fields):
            keys, counts, first = counter.field(f)
            vocabs.append(
                build_vocab(keys, counts, first, min_count=opt.min_count, id_order=opt.id_order)
            )
        del counter
        fields = make_fields(field_names, [v.cardinality for v in vocabs])
        offsets = np.array([f.offset for f in fields], dtype=np.int64)

        n_test_tail = 0
        if test_source is None and opt.split == "tail":
            n_test_tail = int(round(opt.test_fraction * rows_in["train"]))
        tail_start = rows_in["train"] - n_test_tail

        # Pass 2: map the spilled blocks to ids and write.
        writer = DatasetWriter(out, fields, num_dense, name=opt.name, overwrite=opt.overwrite)
        try:
            t_pass2, positives = _write_pass(
                spill, num_dense, vocabs, offsets, writer, opt, tail_start, rows_in
            )
            _finish_meta(
                writer,
                source,
                test_source,
                opt,
                report,
                vocabs,
                rows_in,
                positives,
                t_pass1,
                t_pass2,
            )
            ds = writer.close()
        except BaseException:
            writer.abort()
            raise
    finally:
        spill.close()
    if report.total:
        print(f"{Path(out)}: {report.summary()}", file=sys.stderr)
    return ds


def _write_pass(
    spill: _Spill,
    num_dense: int,
    vocabs: list[FieldVocab],
    offsets: np.ndarray,
    writer: DatasetWriter,
    opt: PreprocessOptions,
    tail_start: int,
    rows_in: dict[str, int],
) -> tuple[float, int]:
    """Pass 2: ids for every spilled block (fields mapped in parallel threads), then write."""
    prog = _Progress(sum(rows_in.values()), "pass 2/2 (write)", opt.progress, unit="rows")
    seen_train = 0
    positives = 0
    workers = max(1, min(_MAP_THREADS, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hetgmp-ids") as pool:
        for role, file_index, block in _prefetch(spill.blocks(num_dense)):
            n = block.keys.shape[0]  # (block.lines is empty unless the split needs it)
            ids = np.empty(block.keys.shape, dtype=writer.id_dtype)

            def map_fields(fs: range, block: RawBlock = block, ids: np.ndarray = ids) -> None:
                for f in fs:
                    ids[:, f] = vocabs[f].lookup(block.keys[:, f]) + offsets[f]

            nf = len(vocabs)
            step = -(-nf // workers)
            list(pool.map(map_fields, [range(a, min(a + step, nf)) for a in range(0, nf, step)]))
            if role == "test":
                is_test = np.ones(n, dtype=bool)
            elif opt.split == "tail" or opt.test_fraction == 0.0:
                is_test = seen_train + np.arange(n) >= tail_start
            else:
                is_test = random_split_mask(opt.seed, file_index, block.lines, opt.test_fraction)
            if role == "train":
                seen_train += n
            positives += int(block.labels.sum())
            if not is_test.any():
                writer.append("train", ids, block.dense, block.labels, check_ids=False)
            elif is_test.all():
                writer.append("test", ids, block.dense, block.labels, check_ids=False)
            else:
                for split, mask in (("train", ~is_test), ("test", is_test)):
                    if mask.any():
                        dense = block.dense[mask] if block.dense is not None else None
                        writer.append(split, ids[mask], dense, block.labels[mask], check_ids=False)
            prog.bytes_done(n)
            prog.rows_done(n)
    t_pass2 = prog.close()
    log.info(prog.line())
    return t_pass2, positives


def _finish_meta(
    writer, source, test_source, opt, report, vocabs, rows_in, positives, t_pass1, t_pass2
) -> None:
    total_rows = rows_in["train"] + rows_in["test"]
    writer.meta.source = {
        **source.describe(),
        "test_inputs": test_source.describe()["inputs"] if test_source is not None else None,
        "min_count": opt.min_count,
        "id_order": opt.id_order,
        "id_layout": (
            "per field: kept values (count >= min_count) get 0..k-1 by "
            + (
                "descending count, ties by key"
                if opt.id_order == "frequency"
                else "first appearance in input order"
            )
            + "; values below min_count share the rare id k (present only if such values "
            "exist); a missing categorical is one more value (own id if frequent enough, "
            "else the rare id); global id = field offset + local id"
        ),
        "split": ("test files" if test_source is not None else opt.split),
        "test_fraction": opt.test_fraction if test_source is None else None,
        "seed": opt.seed,
        "rare_local_id": [v.rare_id for v in vocabs],
        "missing_local_id": [v.missing_id for v in vocabs],
        "bad_lines": report.to_dict(),
        "rows_read": total_rows,
        "seconds": {"pass1": round(t_pass1, 3), "pass2": round(t_pass2, 3)},
    }
    writer.meta.stats = {
        "positive_rate": positives / max(total_rows, 1),
        "distinct_values": [v.num_values for v in vocabs],
        "rare_values": [v.num_rare_values for v in vocabs],
    }
