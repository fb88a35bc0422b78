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
The vocabulary (every field's kept keys and ids, the rare / missing ids, the dense transform)
is saved in the output's ``vocab/`` (:mod:`hetgmp.data.vocab_files`). With ``vocab_from`` an
existing data set's vocabulary is used instead of counting: pass 1 only reads and spills, values
not in it take the field's unseen id, and the output has the same fields, offsets and
``num_embeddings`` (:mod:`hetgmp.data.preprocess_vocab`).

Layout: reading (row sources, prefetch, progress) is in :mod:`hetgmp.data.preprocess_stream`,
the spill file in :mod:`hetgmp.data.preprocess_spill`, the options in
:mod:`hetgmp.data.preprocess_options` (re-exported here); this module holds the two passes.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from hetgmp.data.bad_lines import BadInputError, BadLineReport
from hetgmp.data.delimited import RawBlock
from hetgmp.data.delimited_lists import take_lists
from hetgmp.data.format import Dataset, DatasetWriter, make_fields
from hetgmp.data.preprocess_options import SPLIT_MODES, PreprocessOptions
from hetgmp.data.preprocess_spill import Spill
from hetgmp.data.preprocess_stream import Progress, RowSource, log, prefetch, source_blocks
from hetgmp.data.preprocess_vocab import (
    CountedIds,
    FieldIds,
    GrownIds,
    VocabIds,
    open_vocab_from,
)
from hetgmp.data.vocab import FieldVocab, KeyCounter, build_vocab, splitmix64
from hetgmp.data.vocab_files import write_vocabulary
from hetgmp.data.vocab_input import vocab_field_names
from hetgmp.data.vocab_store import Vocabulary

__all__ = [
    "SPLIT_MODES", "PreprocessOptions", "RowSource", "log", "preprocess", "random_split_mask",
]  # fmt: skip

_MAP_THREADS = 2


def random_split_mask(seed: int, file_index: int, lines: np.ndarray, fraction: float) -> np.ndarray:
    """True where a line goes to test: a pure function of (seed, file index, line number)."""
    x = (lines.astype(np.uint64) + (np.uint64(file_index) << np.uint64(40))) ^ splitmix64(
        np.array([seed], dtype=np.uint64)
    )[0]
    u = (splitmix64(x) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return u < fraction


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
    num_single = len(source.field_names)
    field_names = vocab_field_names(source)  # (single-hot, then multi-hot: issue 34)
    num_fields = len(field_names)
    num_dense = len(source.dense_names)

    vocab = open_vocab_from(opt, source, test_source)
    # Pass 1: parse, validate and count; the parsed blocks go to a spill file for pass 2.
    report = BadLineReport(opt.on_bad_line, unit=getattr(source, "unit", "line"))
    counter = None
    if vocab is None or opt.grow_vocab:  # (growing counts the new data's values)
        counter = KeyCounter(num_fields, track_first=opt.id_order == "first-appearance")
    keep_lines = test_source is None and opt.split == "random" and opt.test_fraction > 0.0
    spill = Spill(Path(out).resolve().parent, keep_lines=keep_lines)
    try:
        rows_in, t_pass1 = _count_pass(sources, total_bytes, opt, report, counter, spill)
        if rows_in["train"] == 0:
            where = ", ".join(str(p) for p in source.paths)
            raise BadInputError(f"{where}: no valid data rows ({report.summary()})")
        ids = _field_ids(counter, vocab, field_names, opt)
        del counter
        offsets = np.array([f.offset for f in ids.fields], dtype=np.int64)
        tail_start = _tail_start(rows_in["train"], opt, test_source is not None)

        # Pass 2: map the spilled blocks to ids and write.
        writer = DatasetWriter(out, ids.fields[:num_single], num_dense, name=opt.name,
                               overwrite=opt.overwrite, multi_hot=ids.fields[num_single:])  # fmt: skip
        try:
            t_pass2, positives = _write_pass(
                spill, num_dense, ids, offsets, writer, opt, tail_start, rows_in
            )
            _finish_meta(writer, source, test_source, opt, report, ids, rows_in,
                         positives, t_pass1, t_pass2)  # fmt: skip
            _save_vocabulary(writer, ids, source, opt)
            ds = writer.close()
        except BaseException:
            writer.abort()
            raise
    finally:
        spill.close()
    if report.total:
        print(f"{Path(out)}: {report.summary()}", file=sys.stderr)
    return ds


def _count_pass(
    sources: list[tuple[str, RowSource]],
    total_bytes: int,
    opt: PreprocessOptions,
    report: BadLineReport,
    counter: KeyCounter | None,
    spill: Spill,
) -> tuple[dict[str, int], float]:
    """Pass 1: count every block's keys (unless a vocabulary is given) and spill it; rows per
    role and the pass's seconds."""
    rows_in = {"train": 0, "test": 0}
    prog = Progress(
        total_bytes, "pass 1/2 (" + ("count" if counter else "read") + ")", opt.progress
    )
    for role, file_index, block in source_blocks(sources, report, prog):
        if counter is not None:
            counter.add(block.keys, block.lists)
        spill.put(role, file_index, block)
        rows_in[role] += len(block)
    t_pass1 = prog.close()
    log.info(prog.line())
    return rows_in, t_pass1


def _build_vocabs(counter: KeyCounter, num_fields: int, opt: PreprocessOptions) -> list[FieldVocab]:
    """One vocabulary per field from the pass-1 counts."""
    vocabs: list[FieldVocab] = []
    for f in range(num_fields):
        keys, counts, first = counter.field(f)
        vocabs.append(
            build_vocab(
                keys,
                counts,
                first,
                min_count=opt.min_count,
                id_order=opt.id_order,
                reserve_rare=opt.reserve_rare_id,
            )
        )
    return vocabs


def _field_ids(
    counter: KeyCounter | None,
    vocab: Vocabulary | None,
    field_names: list[str],
    opt: PreprocessOptions,
) -> FieldIds:
    """Ids from pass 1's counts, or from the ``--vocab-from`` vocabulary (grown by the counts
    with ``--grow-vocab``)."""
    if vocab is not None:
        return VocabIds(vocab) if counter is None else GrownIds(vocab, counter)
    assert counter is not None  # one of the two is always set by preprocess
    vocabs = _build_vocabs(counter, len(field_names), opt)
    return CountedIds(vocabs, make_fields(field_names, [v.cardinality for v in vocabs]))


def _tail_start(train_rows: int, opt: PreprocessOptions, has_test_files: bool) -> int:
    """Index of the first train-input row that ``--split tail`` sends to test."""
    n_test_tail = 0
    if not has_test_files and opt.split == "tail":
        n_test_tail = int(round(opt.test_fraction * train_rows))
    return train_rows - n_test_tail


def _write_pass(
    spill: Spill,
    num_dense: int,
    field_ids: FieldIds,
    offsets: np.ndarray,
    writer: DatasetWriter,
    opt: PreprocessOptions,
    tail_start: int,
    rows_in: dict[str, int],
) -> tuple[float, int]:
    """Pass 2: ids for every spilled block (fields mapped in parallel threads), then write."""
    prog = Progress(sum(rows_in.values()), "pass 2/2 (write)", opt.progress, unit="rows")
    seen_train = 0
    positives = 0
    workers = max(1, min(_MAP_THREADS, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hetgmp-ids") as pool:
        for role, file_index, block in prefetch(spill.blocks(num_dense)):
            n = block.keys.shape[0]  # (block.lines is empty unless the split needs it)
            ids = np.empty(block.keys.shape, dtype=writer.id_dtype)

            def map_fields(fs: range, block: RawBlock = block, ids: np.ndarray = ids) -> None:
                for f in fs:
                    ids[:, f] = field_ids.local(f, block.keys[:, f]) + offsets[f]

            nf = ids.shape[1]
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
            lists = [(field_ids.local(nf + k, v) + offsets[nf + k], o)
                     for k, (v, o) in enumerate(block.lists)]  # fmt: skip
            _append(writer, ids, block, lists, is_test)
            prog.advance(n)  # (the bar counts rows here)
            prog.rows_done(n)
    t_pass2 = prog.close()
    log.info(prog.line())
    return t_pass2, positives


def _append(
    writer: DatasetWriter,
    ids: np.ndarray,
    block: RawBlock,
    lists: list[tuple[np.ndarray, np.ndarray]],
    is_test: np.ndarray,
) -> None:
    """Write one block's rows (ids, multi-hot lists of ids) to train and test by ``is_test``."""
    if not is_test.any() or is_test.all():
        split = "test" if is_test.all() else "train"
        writer.append(split, ids, block.dense, block.labels, check_ids=False, multi_hot=lists)
        return
    for split, mask in (("train", ~is_test), ("test", is_test)):
        if mask.any():
            dense = block.dense[mask] if block.dense is not None else None
            writer.append(split, ids[mask], dense, block.labels[mask], check_ids=False,
                          multi_hot=take_lists(lists, mask))  # fmt: skip


def _finish_meta(
    writer: DatasetWriter,
    source: RowSource,
    test_source: RowSource | None,
    opt: PreprocessOptions,
    report: BadLineReport,
    field_ids: FieldIds,
    rows_in: dict[str, int],
    positives: int,
    t_pass1: float,
    t_pass2: float,
) -> None:
    """meta.json's ``source`` (inputs, vocabulary rules, split, bad lines) and ``stats``."""
    total_rows = rows_in["train"] + rows_in["test"]
    writer.meta.source = {
        **source.describe(),
        "test_inputs": test_source.describe()["inputs"] if test_source is not None else None,
        **field_ids.source_meta(opt),
        "split": ("test files" if test_source is not None else opt.split),
        "test_fraction": opt.test_fraction if test_source is None else None,
        "seed": opt.seed,
        "bad_lines": report.to_dict(),
        "rows_read": total_rows,
        "seconds": {"pass1": round(t_pass1, 3), "pass2": round(t_pass2, 3)},
    }
    writer.meta.stats = {"positive_rate": positives / max(total_rows, 1), **field_ids.stats()}


def _save_vocabulary(
    writer: DatasetWriter, field_ids: FieldIds, source: RowSource, opt: PreprocessOptions
) -> None:
    """``vocab/`` in the writer's temporary directory, so it appears with the data."""
    if isinstance(field_ids, CountedIds):
        write_vocabulary(
            writer.tmp,
            field_ids.fields,
            field_ids.vocabs,
            source,
            min_count=opt.min_count,
            id_order=opt.id_order,
            reserve_rare=opt.reserve_rare_id,
        )
    elif isinstance(field_ids, VocabIds):  # (the ids came from --vocab-from's vocabulary)
        field_ids.copy_files(writer.tmp)
