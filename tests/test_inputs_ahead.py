"""train/inputs_ahead: a next batch's dense features and labels gathered into its ring slot's
fixed buffers, and taken by the step that takes that batch's primed rows (else gathered)."""

from __future__ import annotations

import types

import numpy as np
import torch

from hetgmp.data.device_batches import EpochPlan, ResidentSource, step_slots
from hetgmp.train.inputs_ahead import InputsAhead, exact_primed


def _source(ds) -> ResidentSource:
    split = ds.train
    plan = EpochPlan(split, np.arange(len(split), dtype=np.int64), 16, False, 0)
    slots = step_slots(plan, step=0, epoch=0, batch=0, steps_per_epoch=1, total_steps=1)
    return ResidentSource(plan, slots, torch.device("cpu"), ids_int32=False)


def _primed(ring: int, exact: bool = True) -> types.SimpleNamespace:
    return types.SimpleNamespace(prep=types.SimpleNamespace(ring=ring), exact=exact)


def test_filled_slots_are_taken_and_keep_their_addresses(tiny_dataset) -> None:
    src, inputs = _source(tiny_dataset), InputsAhead(3)
    pos_a, pos_b = torch.arange(0, 16), torch.arange(40, 56)
    inputs.fill_next(_primed(1), src, pos_a)
    dense_addr = inputs.batch(1, torch.zeros(0)).dense.data_ptr()
    inputs.fill_next(_primed(2), src, pos_b)  # (another slot: slot 1 untouched)
    ids = src.gather_ids(pos_a)
    got, want = inputs.take(_primed(1), src, pos_b, ids), src.gather(pos_a)
    assert got.sparse is ids  # (the primed plan's ids, as given)
    assert torch.equal(got.dense, want.dense) and torch.equal(got.labels, want.labels)
    assert got.dense.data_ptr() == dense_addr  # (fixed buffers: a graph reads these)
    inputs.fill_next(_primed(1), src, pos_b)  # refilled in place
    assert torch.equal(inputs.batch(1, ids).labels, src.gather(pos_b).labels)
    assert inputs.batch(1, ids).dense.data_ptr() == dense_addr


def test_without_an_exact_primed_batch_the_step_gathers(tiny_dataset) -> None:
    src, inputs = _source(tiny_dataset), InputsAhead(3)
    pos = torch.arange(16, 32)
    inputs.fill_next(None, src, torch.arange(0, 16))  # (nothing primed early: nothing filled)
    assert not inputs.has(0)
    got = inputs.take(None, src, pos, None)
    assert torch.equal(got.labels, src.gather(pos).labels)
    ahead = types.SimpleNamespace(primed=_primed(0, exact=False))
    assert exact_primed(ahead, early=True) is None  # (planned only: not exchanged early)
    assert exact_primed(types.SimpleNamespace(primed=_primed(0)), early=False) is None
