"""The async service's scripted arithmetic (:mod:`hetgmp.embedding.rowservice.answer`)
against its plain references: the owner's update against :func:`protocol.apply_at_owner`
(torch row kernels), the read answer against :func:`protocol.lags` and plain gathers, on the
CPU and (where there is one) on CUDA; error codes. (Why it is scripted, the GIL, is measured
by ``bench/async_convoy.py``: no timings in tests.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetgmp.embedding import protocol
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.rowservice import answer as aa
from hetgmp.embedding.rowservice.service import _own_slots
from hetgmp.embedding.store import RowStore

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def make_store(opt: SparseOptimizer, device: str, seed: int = 0) -> RowStore:
    """Rank 0 of 2 over 40 rows: owns the even ids, mirrors ids 1 and 3."""
    owner = np.arange(40) % 2
    store = RowStore(
        40, 4, rank=0, world=2, device=torch.device(device), owner=owner,
        mirrors=np.array([1, 3]), opt=opt, seed=seed, init_scale=0.1,
    )  # fmt: skip
    if opt.state_width:  # (distinct accumulators: the update depends on them)
        store.opt_state.copy_(torch.rand(store.opt_state.shape, generator=_gen(seed)))
    return store


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def updates(seed: int, store: RowStore, pushes: int) -> tuple[tuple, list[tuple]]:
    """The own rows' (distinct) gradient and ``pushes`` pushes whose rows repeat and overlap."""
    g, dev, n = _gen(seed), store.device, store.n_own
    own_slots = torch.randperm(n, generator=g)[: n // 2]
    own = (own_slots, torch.randint(1, 4, (own_slots.numel(),), generator=g),
           torch.randn(own_slots.numel(), store.dim, generator=g))  # fmt: skip
    pushed = []
    for _ in range(pushes):
        k = int(torch.randint(0, 12, (1,), generator=g))
        slots = torch.randint(0, n, (k,), generator=g)
        pushed.append((slots, torch.randint(1, 4, (k,), generator=g),
                       torch.randn(k, store.dim, generator=g)))  # fmt: skip
    move = lambda q: tuple(t.to(dev) for t in q)  # noqa: E731
    return move(own), [move(q) for q in pushed]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["sgd", "adagrad"])
@pytest.mark.parametrize("pushes", [0, 1, 3])
def test_apply_updates_equals_apply_at_owner(device: str, name: str, pushes: int) -> None:
    opt = SparseOptimizer(name=name, lr=0.1, kernels="torch")
    want, got = make_store(opt, device), make_store(opt, device)
    own, pushed = updates(7 + pushes, want, pushes)
    cat = tuple(torch.cat([q[i] for q in pushed]) if pushed else own[i][:0] for i in range(3))
    protocol.apply_at_owner(want, opt, own, cat)
    aa.apply_updates(
        got.weight, got.version, got.opt_state, got.scratch_map(), *own,
        [q[0] for q in pushed], [q[1] for q in pushed], [q[2] for q in pushed],
        name == "sgd", opt.lr, opt.eps,
    )  # fmt: skip
    assert not torch.equal(want.weight, make_store(opt, device).weight)  # (it did update)
    torch.testing.assert_close(got.weight, want.weight, rtol=1e-6, atol=1e-7)
    assert torch.equal(got.version, want.version)
    torch.testing.assert_close(got.opt_state, want.opt_state, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("send_all", [False, True])
def test_read_answer_equals_plain_read(device: str, send_all: bool) -> None:
    opt = SparseOptimizer(name="adagrad", lr=0.1)
    store = make_store(opt, device)
    g = _gen(3)
    store.version.copy_(torch.randint(0, 9, store.version.shape, generator=g))
    own_slot = _own_slots(store)
    mids = torch.tensor([0, 2, 4, 6, 8, 10], device=device)
    mver = torch.tensor([0, 5, 9, 1, 2, 8], device=device)
    rids = torch.tensor([12, 38, 12], device=device)
    bound = 3
    code, out = aa.read_answer(
        own_slot, store.num_rows, store.weight, store.version, store.opt_state, True,
        mids.cpu(), mver.cpu(), rids.cpu(), bound, send_all,
    )  # fmt: skip
    assert code == aa.OK and all(t.device.type == "cpu" for t in out)
    m_slot, r_slot = store.slot_of[mids].long(), store.slot_of[rids].long()
    lag = protocol.lags(store, m_slot, mver)
    sent = m_slot if send_all else m_slot[lag > bound]
    rows = torch.cat([sent, r_slot])
    assert torch.equal(out[0], lag.cpu())
    assert 0 < sent.numel() < 6 or send_all  # (some mirrors stale, some fresh)
    assert torch.equal(out[1], store.weight[rows].cpu())
    assert torch.equal(out[2], store.version[rows].cpu())
    assert torch.equal(out[3], store.opt_state[rows].cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_ids_outside_the_table_or_not_owned_give_their_code(device: str) -> None:
    store = make_store(SparseOptimizer(), device)
    own_slot = _own_slots(store)
    args = (own_slot, store.num_rows, store.weight, store.version, store.opt_state, False)
    t = lambda *x: torch.tensor(x, dtype=torch.int64)  # noqa: E731 (requests: on the host)
    for mids, rids, read, push in [
        (t(0), t(40), aa.OUTSIDE, aa.OUTSIDE), (t(-1), t(), aa.OUTSIDE, aa.OK),
        (t(1), t(2), aa.NOT_OWNED, aa.OK), (t(), t(3), aa.NOT_OWNED, aa.NOT_OWNED),
        (t(2), t(4), aa.OK, aa.OK),
    ]:  # fmt: skip
        got, out = aa.read_answer(*args, mids, torch.zeros_like(mids), rids, 0, False)
        assert (got, len(out) > 0) == (read, read == aa.OK), (mids, rids)
        grad, cnt = torch.zeros(rids.numel() * 4), torch.ones_like(rids)
        dev = store.device
        got, slots, c, g = aa.push_slots(own_slot, store.num_rows, rids, cnt, grad, 4, dev)
        assert got == push, rids
        if push == aa.OK:
            assert torch.equal(slots, store.slot_of[rids.to(dev)].long())
            assert g.shape == (rids.numel(), 4)
            assert {t.device.type for t in (g, c, slots)} == {dev.type}
