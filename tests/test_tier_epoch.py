"""Several ranks' owned rows held resident for an epoch (issue 33; the pieces of
docs/host_tier_plan.md's last section, not yet wired into the whole-step graph):
``epoch_requests`` gives every owner exactly its rows among every rank's ids, and
``OwnedTier.hold_epoch`` keeps them resident through the epoch's other residency decisions,
writes them back when a later epoch evicts them, and refuses a hold past the cache."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.embedding import DistributedEmbedding
from hetgmp.embedding.tier_epoch import epoch_requests
from hetgmp.embedding.tier_host import CacheBudgetError
from hetgmp.partition.plan import Plan

ROWS = 400


def _owner(world: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(1).integers(0, world, ROWS))


def _ids(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, ROWS, (37, 3), generator=g)
    ids[::5, 1] = -1  # (padding)
    return ids


def _requests(env: DistEnv) -> list[int]:
    return epoch_requests(env, _ids(env.rank), _owner(env.world_size)).tolist()


def test_every_owner_gets_its_rows_among_every_ranks_ids() -> None:
    world = 3
    got = spawn_ranks(_requests, world, timeout_s=120)
    owner = _owner(world)
    every = torch.cat([_ids(r).reshape(-1) for r in range(world)])
    every = every[every >= 0]
    for r in range(world):
        want = torch.unique(every[owner[every] == r]).tolist()
        assert got[r] == want and want, (r, got[r][:5], want[:5])


def _holds(env: DistEnv) -> dict:
    w = env.world_size
    owner = _owner(w).numpy().astype(np.int32)
    plan = Plan(np.zeros(w * 4, np.int32), owner, [np.zeros(0, np.int64)] * w, {})
    emb = DistributedEmbedding(ROWS, 4, env, plan, optimizer="adagrad", lr=0.1, seed=3,
                               rows_on="host", cache_budget=0.25)  # fmt: skip
    owned, store, tier = emb.owned, emb.store, emb.tier
    assert owned is not None and tier is not None
    mine = torch.from_numpy(np.flatnonzero(owner == env.rank))
    n = tier.budget
    assert not bool((store.slot_of[mine[-n:]] >= 0).any())  # (the cold end: not resident)
    a, b, c = mine[-20:], mine[-n:-20], mine[:n]
    slots = owned.hold_epoch(torch.cat([a, a]))  # (repeats: held once)
    assert slots.numel() == 20 and bool((store.slot_of[a] >= 0).all())
    before = store.slot_of[a].clone()
    with torch.no_grad():  # (a step's update of the held rows, in the cache)
        store.weight_full[before.long()] += 1.0
    moved = store.weight_full[before.long()].clone()
    saved = owned.owned_rows()  # (a checkpoint mid-epoch: the held rows' values, written back)
    pos = torch.searchsorted(saved["ids"], a)
    assert torch.equal(saved["weight"][pos], moved)
    # (a step's own decision beside the hold: the rest of the cache turns over, the hold stays)
    owned.before_plan(b.view(-1, 1))
    assert any(h is owned.epoch for h in tier._held)  # noqa: SLF001 - the keep list
    assert torch.equal(store.slot_of[a], before) and bool((store.slot_of[b] >= 0).all())
    owned.step_done()
    owned.step_done()  # (nothing else held)
    owned.hold_epoch(c)  # (the whole cache: the last epoch's rows go, written back)
    out = {"evicted": bool((store.slot_of[a] < 0).all())}
    rows = owned.index[a]
    out["written_back"] = torch.equal(tier.host_weight[rows], moved)
    with pytest.raises(CacheBudgetError):
        owned.hold_epoch(mine[: tier.budget + 1])
    return out


def test_a_held_epoch_stays_resident_and_is_written_back_when_evicted() -> None:
    for out in spawn_ranks(_holds, 2, timeout_s=120):
        assert out == {"evicted": True, "written_back": True}, out


def _skewed(root: Path) -> SimpleNamespace:
    """Three fields of 300 ids each whose samples draw skewed ids: an epoch touches about a
    third of the rows (the epoch's hold fits a 60 % cache; the rest stays on the host)."""
    from hetgmp.data.format import make_fields, open_dataset, write_dataset

    rng = np.random.default_rng(5)
    cards = [300, 300, 300]
    fields = make_fields(["a", "b", "c"], cards)
    offs = np.array([f.offset for f in fields])

    def split(n: int):  # type: ignore[no-untyped-def]
        local = np.stack([np.minimum(rng.zipf(1.4, n) - 1, c - 1) for c in cards], axis=1)
        return (
            local + offs,
            rng.random((n, 2), dtype=np.float32),
            (rng.random(n) < 0.3).astype(np.float32),
        )

    write_dataset(root, fields, {"train": split(480), "test": split(96)}, num_dense=2)
    ds = open_dataset(root)
    return SimpleNamespace(root=root, train=ds.train, meta=ds.meta, fingerprint=ds.fingerprint)


def _whole_tier(env: DistEnv, cfg) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    from test_whole_step_multi import _rank, interpreter_now

    interpreter_now()

    from hetgmp.embedding import tier_windows

    held, real = [], tier_windows.hold_rows

    def hold(env_, ctx, ids) -> int:  # type: ignore[no-untyped-def]
        held.append(real(env_, ctx, ids))
        held.append(int((ctx.store.slot_of[ctx.owned.own_ids] >= 0).sum()))
        return held[-2]

    tier_windows.hold_rows = hold  # type: ignore[assignment]
    device = _rank(env, cfg, True, None)
    host_cfg = dataclasses.replace(cfg, rows_on="host", cache_budget=0.6, cache_warm="cold")
    host = _rank(env, host_cfg, True, None)
    host["held"] = held
    return device, host


@pytest.mark.slow  # (~40 s: two whole-step runs in Triton's interpreter)
def test_whole_step_flow_with_epoch_held_owned_rows_trains_as_all_on_device(tmp_path) -> None:
    """Two gloo ranks, the padded exchange's whole-step flow (fused segments in Triton's
    interpreter), owned rows on the host tier with a 60 % cache started cold: each epoch
    start holds every owned row the epoch touches on any rank, and at bound 0 the run ends
    where the all-on-device run ends (rows, optimizer state, dense layers)."""
    pytest.importorskip("triton")
    from test_whole_step_multi import _assert_runs_equal, _cfg, _plan

    ds = _skewed(tmp_path / "ds")
    plan = _plan(ds, 2, tmp_path / "part.npz")
    cfg = _cfg(ds.root, plan, optimizer="adagrad", bound=0, kernels="triton", epochs=2)
    runs = spawn_ranks(_whole_tier, 2, cfg, timeout_s=300, start_method="spawn")
    device, host = [r[0] for r in runs], [r[1] for r in runs]

    _assert_runs_equal(device, host, counters=False)
    for d, h in zip(device, host, strict=True):  # (the tier's steps replay like the device's:
        # a source read one batch ahead for the tier once made every step eager)
        assert h["replays"] == d["replays"] > 0 and h["eager"] == d["eager"], (h, d)
    for h in host:
        held = h["held"]
        assert len(held) >= 4 and 0 < held[0] <= held[1], held  # (each epoch: held, resident)


def test_padded_tier_outside_the_whole_step_flow_is_refused() -> None:
    """The eager padded step never makes the peers' rows resident: the trainer refuses
    several ranks' host tier on the padded exchange there, naming what to pass instead."""
    from hetgmp.embedding.tier_setup import check_owned_flow

    table = SimpleNamespace(owned=object(), exchange="padded")
    with pytest.raises(ValueError, match="pass --exchange exact otherwise"):
        check_owned_flow(table, whole_step=False)
    check_owned_flow(table, whole_step=True)
    check_owned_flow(SimpleNamespace(owned=object(), exchange="exact"), whole_step=False)
    check_owned_flow(SimpleNamespace(owned=None, exchange="padded"), whole_step=False)


def _windowed(env: DistEnv, cfg, budget: float) -> tuple[dict, dict, dict]:  # type: ignore[no-untyped-def]
    from test_whole_step_multi import _rank, interpreter_now

    from hetgmp.embedding import tier_windows

    interpreter_now()
    made: list = []
    real = tier_windows.EpochWindows.__init__

    def init(self, *a) -> None:  # type: ignore[no-untyped-def]
        real(self, *a)
        made.append(self)

    tier_windows.EpochWindows.__init__ = init  # type: ignore[method-assign]
    from hetgmp.embedding.tier_owned import OwnedTier

    gaps: list[int] = []  # (rows a step found missing inside a hold: the hold's gaps)
    plan = OwnedTier.before_plan

    def before_plan(self, ids) -> None:  # type: ignore[no-untyped-def]
        misses = self.tier.counters.misses
        plan(self, ids)
        if not self.released and self.epoch.numel():  # (a training step inside a hold)
            gaps.append(self.tier.counters.misses - misses)

    OwnedTier.before_plan = before_plan  # type: ignore[method-assign]
    device = _rank(env, cfg, True, None)
    host_cfg = dataclasses.replace(cfg, rows_on="host", cache_budget=budget, cache_warm="cold")
    try:
        host = _rank(env, host_cfg, True, None)
    except ValueError as e:
        return device, {"error": str(e)}, {}
    w = made[-1]
    return device, host, {"holds": w.holds, "halvings": w.halvings, "length": w.length,
                          "steps_held": len(gaps), "gaps": sum(gaps)}  # fmt: skip


@pytest.mark.slow  # (~40 s: two whole-step runs in Triton's interpreter)
def test_an_epoch_too_big_for_the_cache_is_held_window_by_window(tmp_path) -> None:
    """A cache that holds a few steps' rows, not an epoch's: the epoch is cut into windows
    (halved until each fits), each window start holds its rows, an evaluation between steps
    finds the hold let go (a flush releases it; the next step holds again), and at bound 0
    the run still ends where the all-on-device run ends; a cache smaller than one step's
    rows stops every rank with the --cache-budget to take (no rank left waiting)."""
    pytest.importorskip("triton")
    from test_whole_step_multi import _assert_runs_equal, _cfg, _plan

    ds = _skewed(tmp_path / "ds")
    plan = _plan(ds, 2, tmp_path / "part.npz")
    cfg = _cfg(ds.root, plan, optimizer="adagrad", bound=0, kernels="triton", epochs=2,
               val=True, eval_every=4)  # (an evaluation needs the cache a hold fills)  # fmt: skip
    runs = spawn_ranks(_windowed, 2, cfg, 0.2, timeout_s=300, start_method="spawn")
    _assert_runs_equal([r[0] for r in runs], [r[1] for r in runs], counters=False)
    for _, h, w in runs:
        assert w["halvings"] > 0 and w["length"] < 9 and w["holds"] > 2, w  # (9 steps/epoch)
        # (on CPU each step still makes its batch resident itself, which would hide a gap
        # in a hold: it must find nothing missing)
        assert w["steps_held"] > 10 and w["gaps"] == 0, w
        assert h["replays"] > 0, h
    tiny = spawn_ranks(_windowed, 2, cfg, 0.03, timeout_s=300, start_method="spawn")
    assert all("raise --cache-budget to at least" in h["error"] for _, h, _ in tiny), tiny


def _streamed_tier(env: DistEnv, cfg) -> str:  # type: ignore[no-untyped-def]
    from test_whole_step_multi import _rank, interpreter_now

    interpreter_now()
    try:
        _rank(env, cfg, True, None)
    except ValueError as e:
        return str(e)
    return "trained"


# (~5 s: two spawned ranks)
def test_padded_tier_refused_when_the_samples_are_streamed(tmp_path) -> None:
    """Samples not resident on the device: the whole-step flow falls back to eager steps,
    and the trainer then refuses the padded exchange with a tier (it asks after the fallback,
    not before: a check before it let the eager padded step run with rows not resident)."""
    pytest.importorskip("triton")
    from test_whole_step_multi import _cfg, _plan

    ds = _skewed(tmp_path / "ds")
    plan = _plan(ds, 2, tmp_path / "part.npz")
    cfg = _cfg(ds.root, plan, optimizer="adagrad", bound=0, kernels="torch", epochs=1,
               rows_on="host", cache_budget=0.6, data_on_device="off")  # fmt: skip
    said = spawn_ranks(_streamed_tier, 2, cfg, timeout_s=300, start_method="spawn")
    assert all("pass --exchange exact otherwise" in s for s in said), said


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_tiered_whole_step_graph_on_two_gpus(tmp_path) -> None:
    """The same inside the captured step on 2 GPUs (tests/gpu_tier_whole_check.py)."""
    from test_whole_step_multi import _torchrun_check

    _torchrun_check("gpu_tier_whole_check.py", tmp_path, "TIER WHOLE STEP CHECK OK")
