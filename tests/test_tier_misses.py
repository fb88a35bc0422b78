"""A batch's misses of the device cache (:func:`hetgmp.embedding.tier_misses.miss_slots`)
against a plain-Python account of them: cached rows keep their slots, every distinct missed
row gets one entry (``C + entry`` in every one of its occurrences), entries are dense and list
their rows, the scratch map needs no reset between batches, and an overflow is never a wrong
row."""

from __future__ import annotations

import torch

from hetgmp.embedding.tier_misses import miss_slots


def _check(ids: torch.Tensor, slot_of: torch.Tensor, c: int, m: int, pos: torch.Tensor) -> None:
    plan = miss_slots(ids, slot_of, pos, c, m)
    flat, slots = ids.reshape(-1).tolist(), plan.slots.reshape(-1).tolist()
    assert plan.slots.shape == ids.shape and plan.slots.dtype == torch.int64
    missed = sorted({r for r in flat if int(slot_of[r]) < 0})
    assert int(plan.misses) == len(missed)
    entry_of: dict[int, int] = {}
    for r, s in zip(flat, slots, strict=True):
        if int(slot_of[r]) >= 0:
            assert s == int(slot_of[r])  # a cached row keeps its slot
        else:
            assert c <= s < c + len(missed)
            assert entry_of.setdefault(r, s - c) == s - c  # one entry per row
    rows = plan.rows.tolist()
    assert sorted(entry_of.values()) == list(range(len(missed)))  # dense entries
    assert all(rows[e] == r for r, e in entry_of.items())  # listed
    assert rows[len(missed) :] == [-1] * (m - len(missed))


def test_misses_match_a_plain_account() -> None:
    g = torch.Generator().manual_seed(0)
    num_rows, c = 500, 60
    slot_of = torch.full((num_rows,), -1, dtype=torch.int32)
    cached = torch.randperm(num_rows, generator=g)[:c]
    slot_of[cached] = torch.arange(c, dtype=torch.int32)
    pos = torch.full((num_rows + 1,), 7, dtype=torch.int32)  # (any contents: never reset)
    for b, f in ((64, 5), (1, 1), (200, 3), (33, 26)):
        ids = (torch.rand(b, f, generator=g) ** 3 * num_rows).long()  # hot rows repeat
        _check(ids, slot_of, c, b * f, pos)
    _check(torch.zeros(0, 4, dtype=torch.int64), slot_of, c, 0, pos)  # an empty batch
    every_hit = cached[:10].reshape(2, 5)
    plan = miss_slots(every_hit, slot_of, pos, c, 10)
    assert int(plan.misses) == 0 and torch.equal(plan.slots, slot_of[every_hit].long())


def test_an_overflow_is_out_of_range_never_a_wrong_row() -> None:
    slot_of = torch.full((100,), -1, dtype=torch.int32)
    pos = torch.zeros(101, dtype=torch.int32)
    ids = torch.arange(10).reshape(2, 5)  # 10 distinct misses, room for 4
    plan = miss_slots(ids, slot_of, pos, 3, 4)
    inside = plan.slots < 3 + 4
    assert int(plan.misses) == 10 and int(inside.sum()) == 4
    rows = plan.rows.tolist()
    for r, s in zip(ids.reshape(-1).tolist(), plan.slots.reshape(-1).tolist(), strict=True):
        if s < 7:
            assert rows[s - 3] == r  # the entries that fit list their own rows
