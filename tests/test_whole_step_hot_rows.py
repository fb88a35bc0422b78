"""The whole step's epoch scan counts, per batch, the rows it holds more than --bound times
(each a sample-level update a read one step ahead would miss: docs/scaling_plan.md), and the
log says the epoch's most once, above bound 0."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hetgmp.embedding.padded.epoch_scan import _chunk
from hetgmp.embedding.padded.whole import WholeStep


def _fake(bound: int) -> SimpleNamespace:
    store = SimpleNamespace(num_rows=10, block_of=torch.zeros(10, dtype=torch.int64))
    return SimpleNamespace(
        ctx=SimpleNamespace(store=store, bound=bound),
        padded=SimpleNamespace(frozen="cap", static=None), epoch_hot=0, _hot_said=False,
        _payloads_said=False, _scan_said=False, scan_seconds=0.0, last_scan=0.0,
    )  # fmt: skip


def test_rows_over_the_bound_are_counted_per_batch() -> None:
    # batches of 3 samples x 2 fields: batch 0 holds row 1 four times, row 3 twice;
    # batch 1 rows 5, 6 once each and row 7 four times; batch 2 (partial) row 2 twice
    ids = torch.tensor([[1, 1], [1, 3], [1, 3], [5, 7], [7, 6], [7, 7], [2, 2]])
    got = _chunk(_fake(bound=1).ctx.store, 1, ids, 3, 2)
    assert got[:, 1].tolist() == [2, 3, 1]  # distinct rows per batch
    assert got[:, 3].tolist() == [2, 1, 1]  # rows held more than once
    got = _chunk(_fake(bound=3).ctx.store, 3, ids, 3, 2)
    assert got[:, 3].tolist() == [1, 1, 0]  # more than 3 times: rows 1 and 7


def test_the_log_says_it_once_above_bound_0() -> None:
    fake = _fake(bound=100)
    fake.epoch_hot = 349
    notes = WholeStep.epoch_notes(fake, "cap")
    assert len(notes) == 1 and notes[0].startswith("up to 349 rows per step occur more than")
    assert WholeStep.epoch_notes(fake, "cap") == []  # (once)
    strict = _fake(bound=0)
    strict.epoch_hot = 5
    grown = WholeStep.epoch_notes(strict, "old cap")
    assert len(grown) == 1 and grown[0].startswith("exchange capacities grew")
    scanned = _fake(bound=0)
    scanned.scan_seconds = scanned.last_scan = 0.0123
    notes = WholeStep.epoch_notes(scanned, "cap")
    assert notes == ["epoch-start scan of the batches' rows per peer: 12 ms (each epoch start; "
                     "results: epoch_scan_s)"]  # fmt: skip
    assert WholeStep.epoch_notes(scanned, "cap") == []  # (once)


def test_the_log_says_once_how_the_payloads_travel() -> None:
    """Once the exchange's buffers exist (after the first epoch start, at the latest the
    second), the log says once how its payloads travel (peer memory or the all-to-alls)."""
    fake = _fake(bound=0)
    assert WholeStep.epoch_notes(fake, "cap") == []  # (no buffers yet)
    fake.padded.static = SimpleNamespace(payload_note="all-to-alls (no peer memory: why)")
    assert WholeStep.epoch_notes(fake, "cap") == [
        "exchange payloads: all-to-alls (no peer memory: why)"
    ]
    assert WholeStep.epoch_notes(fake, "cap") == []  # (once)
