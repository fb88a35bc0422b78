"""Rows made resident a step ahead (hetgmp/embedding/tiered.py, tier_ahead.py, tier_move.py):
a one-rank table told each next batch (``prefetch``) before it trains the current one equals
the all-on-device table bit for bit, with a cache so small that the next batch often does not
fit beside the rows the current step still updates (then it is made resident at its step), an
evaluation lookup in between and a checkpoint round trip; the synchronous switch
(``overlap=False``) trains the same."""

from __future__ import annotations

import pytest
import torch
from test_tiered_rows import N, batches

from hetgmp.comm.env import DistEnv
from hetgmp.embedding import DistributedEmbedding, tier_setup
from hetgmp.embedding.tier_ahead import DEPTH, AheadQueue


@pytest.fixture(autouse=True)
def _host_decided(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are the host-decided tier's (:mod:`hetgmp.embedding.tiered`: several ranks'
    owned rows use it; one rank takes the device-decided one by default)."""
    monkeypatch.setattr(tier_setup, "DEVICE_TIER", False)


def _table(**kw: object) -> DistributedEmbedding:
    return DistributedEmbedding(N, 8, DistEnv.single(), optimizer="adagrad", lr=0.05,
                                init_scale=0.1, seed=4, **kw)  # fmt: skip


def _train(t: DistributedEmbedding, steps: list[torch.Tensor], *, ahead: bool) -> None:
    g = torch.Generator().manual_seed(6)
    for i, ids in enumerate(steps):
        if ahead and i + 1 < len(steps):
            t.prefetch(steps[i + 1])  # (the trainer's order: the next batch, then this step)
        out = t(ids)
        (out * torch.randn(out.shape, generator=g)).sum().backward()
        if i == 12:  # an evaluation's lookup between steps (not expected: the queue stays)
            t.eval()
            with torch.no_grad():
                t(torch.randint(0, N, (8, 3), generator=torch.Generator().manual_seed(i)))
            t.train()
        if i == 20:
            t.load_state_dict(t.state_dict())


@pytest.mark.parametrize("overlap", [True, False])
def test_rows_resident_ahead_train_as_all_on_device(overlap: bool) -> None:
    steps = batches(40, 24, seed=5)  # <= 72 distinct rows a batch; the cache holds 100
    counts = torch.bincount(torch.cat(steps[:3]).reshape(-1), minlength=N)
    base = _table()
    _train(base, steps, ahead=False)
    tiered = _table(rows_on="host", cache_budget=0.05, row_counts=counts)
    assert tiered.tier is not None
    tiered.tier.overlap = overlap  # (the switch: every batch made resident at its step)
    _train(tiered, steps, ahead=True)
    a, b = base.state_dict(), tiered.state_dict()
    assert torch.equal(a["weight"], b["weight"]) and torch.equal(a["opt_state"], b["opt_state"])
    c = tiered.tier.counters
    if overlap:  # both paths taken: ahead, and at the step when there was no room
        assert c.ahead > 5 and c.ahead_skipped > 5, c
    else:
        assert c.ahead == 0 and c.ahead_skipped == 0
    assert c.misses > 0 and c.written_back > 0


def test_queue_matches_by_identity_and_keeps_depth() -> None:
    q = AheadQueue(None)
    xs = [torch.tensor([[i, i + 1]]) for i in range(DEPTH + 1)]
    for x in xs:
        q.expect(x)
    assert [e.ids for e in q.items] == xs[1:]  # the oldest dropped beyond DEPTH
    assert q.take(torch.tensor([[1, 2]])) is None and len(q.items) == DEPTH  # equal, not it
    got = q.take(xs[2])
    assert got is not None and got.host_ids().tolist() == [2, 3]
    assert q.items == []  # (the batches expected before it went too)
