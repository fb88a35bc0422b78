"""Ranks with unequal batch counts and the padded transport (issue 30's trust side). Whether a
rank takes the padded exchange, its pre-sync path, or rebuilds its buffers were each decided
from this rank's shapes; with one rank's batch full beside another's partial or empty one, the
ranks met in different collectives (on 2 H100s a hang until NCCL's watchdog:
``bench/results/gpu/uneven_s21/``, ``tests/gpu_uneven_check.py``). Now the trainer tells the
engine each step whether every rank's batch is full (``StepEngine.peers_full``): where not,
every rank takes the exact transport, and a rebuild for this rank's own capacities keeps its
peer-memory transport (a new one is a rendezvous). Here on gloo ranks, each step's decisions
recorded on every rank; with the payloads in peer memory (``peer_payloads.ON_CPU``) a rank
that took another path than its peer would hang (the spawn's timeout fails the test)."""

from __future__ import annotations

import pytest
from test_train_dist import _cfg, _uneven_plan

from hetgmp.comm.spawn import spawn_ranks
from hetgmp.train.run import train


def _recorded(env, arg) -> list[tuple[bool, bool, bool]]:  # type: ignore[no-untyped-def]
    """``train(cfg)``; each training step's (every rank full, padded transport, pre-sync)."""
    from hetgmp.embedding.collective.stepper import Stepper
    from hetgmp.embedding.padded import peer_payloads

    cfg, on_cpu = arg
    peer_payloads.ON_CPU = on_cpu
    seen: list[tuple[bool, bool, bool]] = []
    step = Stepper.step

    def recorded(self, prep, *, op, error, training):  # type: ignore[no-untyped-def]
        before = self.padded.presyncs
        out = step(self, prep, op=op, error=error, training=training)
        if training:  # (the batch record holds the padded buffers it took, else None)
            seen.append((self.peers_full, out[1].static is not None, self.padded.presyncs > before))
        return out

    Stepper.step = recorded  # type: ignore[method-assign]
    try:
        train(cfg, env)
    finally:
        Stepper.step = step  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("on_cpu", [False, True], ids=["alltoall", "peer_memory"])
def test_every_rank_takes_the_same_path_with_unequal_batch_counts(
    tiny_dataset, tmp_path, on_cpu: bool
) -> None:
    plan = _uneven_plan(tiny_dataset, 2, tmp_path / "part.npz")  # (rank 0 ~3/4 of the samples)
    cfg = _cfg(tiny_dataset.root, epochs=2, partition=plan, store_rate=1.0, bound=0,
               optimizer="sgd", replies="all", exchange="padded")  # fmt: skip
    ranks = spawn_ranks(_recorded, 2, (cfg, on_cpu), timeout_s=120)
    r0, r1 = ranks
    assert len(r0) == len(r1)
    assert any(not full for full, _, _ in r0), "every step full: the check proves nothing"
    assert any(took for _, _, took in r0), "the pre-sync path never ran"
    for step, (a, b) in enumerate(zip(r0, r1, strict=True)):
        assert a == b, (step, a, b)  # (the same decisions on both ranks)
        full, padded, took = a
        assert full or not (padded or took), (step, a)


def _diverse_data(root, tmp_path):  # type: ignore[no-untyped-def]
    """2048 samples, 3 fields of 3000 ids: rank 0's half draws every id at random (its
    batches' distinct rows fill the capacity at once); rank 1's mixes such samples (40 %) with
    5 repeated ids but for its last 128, so in order (no shuffle) its distinct rows grow its
    capacity at its last batch of the epoch, on rank 1 alone."""
    import numpy as np

    from hetgmp.data.format import make_fields, open_dataset, write_dataset
    from hetgmp.partition.plan import Plan, save_plan

    rng = np.random.default_rng(11)
    fields = make_fields(["a", "b", "c"], [3000] * 3)
    offs = np.array([f.offset for f in fields])
    n = 2048
    local = rng.integers(0, 3000, (n, 3))
    plain = (np.arange(n) >= n // 2) & (np.arange(n) < n - 128) & (rng.random(n) >= 0.4)
    local[plain] = rng.integers(0, 5, (int(plain.sum()), 3))
    labels = (rng.random(n) < 0.3).astype(np.float32)
    split = (local + offs, rng.random((n, 2), dtype=np.float32), labels)
    write_dataset(root, fields, {"train": split, "test": split}, num_dense=2)
    ds = open_dataset(str(root))
    dp = (np.arange(n) >= n // 2).astype(np.int32)
    ep = rng.integers(0, 2, 9000).astype(np.int32)
    mirrors = [rng.permutation(np.flatnonzero(ep != w)).astype(np.int64) for w in range(2)]
    return save_plan(
        Plan(dp, ep, mirrors, {"dataset_fingerprint": ds.fingerprint}), tmp_path / "p.npz"
    )


def test_one_rank_growing_its_own_capacity_meets_no_new_rendezvous(tmp_path) -> None:
    """Every batch full; rank 1's distinct rows grow its ``u`` capacity alone: its rebuild
    keeps the peer-memory transport (a new one would be a rendezvous rank 0 never joins)."""
    plan = _diverse_data(tmp_path / "ds", tmp_path)
    cfg = _cfg(tmp_path / "ds", epochs=1, batch_size=128, partition=plan, store_rate=0.1,
               bound=0, optimizer="sgd", replies="all", exchange="padded", shuffle=False)  # fmt: skip
    (r0, told0), (r1, told1) = spawn_ranks(_rebuilds, 2, (cfg, True), timeout_s=120)
    assert len(r0) != len(r1), (r0, r1)  # (one rank rebuilt alone: its own capacities grew)
    assert (r0[-1].q, r0[-1].p) == (r1[-1].q, r1[-1].p), (r0, r1)  # (the payloads': agreed)
    # (fit unsays what it told the table: a loop of the caller's own may follow, with
    # batches of any size, and must not take the pre-sync path on one rank alone)
    assert told0 is None and told1 is None, (told0, told1)


def _rebuilds(env, arg) -> tuple:  # type: ignore[no-untyped-def,type-arg]
    """``train(cfg)`` with the payloads in peer memory; the capacities this rank built and
    what the table was told last."""
    from hetgmp.embedding import engine_of
    from hetgmp.embedding.padded import peer_payloads
    from hetgmp.train.run import build_trainer, distributed_embedding
    from hetgmp.train.runlog import RunLog

    cfg, peer_payloads.ON_CPU = arg
    tr = build_trainer(cfg, env, RunLog(active=False), distributed_embedding)
    tr.fit()
    engine = engine_of(tr.model.embedding)
    assert engine is not None
    return list(engine.padded_rebuilds()), engine.stepper.peers_full  # type: ignore[attr-defined]


def test_a_step_stopped_after_the_split_update_says_why_and_what_to_do() -> None:
    """A step that stops (a peer's bad ids) or would leave the padded path after the split
    owner update applied this rank's own rows raises, naming the cause where there is one."""
    from types import SimpleNamespace

    from hetgmp.comm.errors import PeerFailedError
    from hetgmp.embedding.collective.stepper import _refuse_after_split

    split = SimpleNamespace(static=SimpleNamespace(own_split=True))
    cause = PeerFailedError("rank 1 reported bad input")
    with pytest.raises(RuntimeError, match="rank 1 reported bad input.*restart") as got:
        _refuse_after_split(split, "stopped", cause)
    assert got.value.__cause__ is cause
    with pytest.raises(RuntimeError, match="applied twice"):
        _refuse_after_split(split, "went to the exact path", None)
    for pe in (None, SimpleNamespace(static=None), SimpleNamespace(static=SimpleNamespace())):
        _refuse_after_split(pe, "stopped", cause)  # (no split update ran: nothing to refuse)


def _whole_rank(env, cfg, whole: bool) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """A run of the whole-step flow (``whole``) or the eager padded path, the payloads in
    peer memory (a rank that took another path than its peer waits for it: a hang)."""
    from test_whole_step_multi import _rank

    from hetgmp.embedding.padded import peer_payloads

    peer_payloads.ON_CPU = True
    return _rank(env, cfg, whole, None)


@pytest.mark.parametrize("optimizer", ["adagrad", "sgd"])
def test_whole_step_flow_with_unequal_batch_counts(tiny_dataset, tmp_path, optimizer) -> None:
    """The whole-step flow (gloo ranks: its "replays" run the captured flow plainly) with
    rank 1 out of full batches before rank 0 each epoch: no hang, and the same rows, state,
    dense layers and counters as the eager padded path."""
    from test_whole_step_multi import _assert_runs_equal
    from test_whole_step_multi import _cfg as whole_cfg

    plan = _uneven_plan(tiny_dataset, 2, tmp_path / "part.npz")
    cfg = whole_cfg(tiny_dataset.root, plan, optimizer=optimizer, bound=3)
    eager = spawn_ranks(_whole_rank, 2, cfg, False, timeout_s=120)
    whole = spawn_ranks(_whole_rank, 2, cfg, True, timeout_s=120)
    _assert_runs_equal(eager, whole)
    assert whole[0]["replays"] > 0 and whole[0]["eager"] > 0, whole[0]


def _direct_loop(env, told, sizes, exchange: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """A custom loop on the table itself (no trainer): this rank's batch sizes ``sizes[rank]``
    (0: an empty batch, rule 1 of docs/python_api.md), the payloads in peer memory; ``told``:
    what the loop tells the table once (None: nothing, as a loop that never read rule 1)."""
    import numpy as np
    import torch
    from test_padded_edge_cases import plan_for

    from hetgmp.embedding import DistributedEmbedding
    from hetgmp.embedding.padded import peer_payloads

    peer_payloads.ON_CPU = True
    emb = DistributedEmbedding(
        97, 4, env, plan_for(2, 97, 5), store_rate=0.3, bound=0, optimizer="sgd", lr=0.05,
        seed=5, replies="all", exchange=exchange,
    )  # fmt: skip
    if told is not None:
        emb.peers_full(told)
    presynced = []
    for t, n in enumerate(sizes[env.rank]):
        rng = np.random.default_rng([t, env.rank])
        ids = torch.from_numpy(np.minimum(rng.zipf(1.3, (n, 3)) - 1, 96).astype(np.int64))
        before = emb.padded_presyncs
        out = emb(ids)
        ((out**2).sum() / 64).backward()
        presynced.append(emb.padded_presyncs - before)
    return {"sd": emb.state_dict(), "presynced": presynced}


def _over_capacity(env, exchange: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """Capacities fixed as an epoch's scan fixes them (``frozen``), then batches it never saw:
    rank 1's hold more distinct rows than the capacity at steps 2 and 4, rank 0's never."""
    import numpy as np
    import torch
    from test_padded_edge_cases import plan_for

    from hetgmp.embedding import DistributedEmbedding
    from hetgmp.embedding.padded.fields import Capacity

    emb = DistributedEmbedding(
        97, 4, env, plan_for(2, 97, 5), store_rate=0.3, bound=0, optimizer="sgd", lr=0.05,
        seed=5, replies="all", exchange=exchange,
    )  # fmt: skip
    if exchange == "padded":
        emb._padded.frozen = Capacity(q=48, p=48, u=12, n=48, o=0)
    for t in range(6):
        rng = np.random.default_rng([t, env.rank])
        wide = env.rank == 1 and t in (2, 4)
        ids = rng.integers(0, 97 if wide else 10, (16, 3)).astype(np.int64)
        out = emb(torch.from_numpy(ids))
        ((out**2).sum() / 64).backward()
    return {"sd": emb.state_dict(), "built": len(emb.padded_rebuilds)}


def _bad_input_told(env, optimizer: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """A loop told that every batch is full; at step 3 rank 1 hands the table float ids (a
    custom loop's mistake). What each rank raised, and whether it took the pre-sync path at
    that step."""
    import numpy as np
    import torch
    from test_padded_edge_cases import plan_for

    from hetgmp.embedding import DistributedEmbedding
    from hetgmp.embedding.padded import peer_payloads

    peer_payloads.ON_CPU = True
    emb = DistributedEmbedding(
        97, 4, env, plan_for(2, 97, 5), store_rate=0.3, bound=0, optimizer=optimizer, lr=0.05,
        seed=5, replies="all", exchange="padded",
    )  # fmt: skip
    emb.peers_full(True)
    for t in range(4):
        rng = np.random.default_rng([t, env.rank])
        ids = torch.from_numpy(np.minimum(rng.zipf(1.3, (8, 3)) - 1, 96).astype(np.int64))
        if t == 3 and env.rank == 1:
            ids = ids.float()
        before = emb.padded_presyncs
        try:
            out = emb(ids)
        except Exception as e:  # noqa: BLE001 - the test reports what each rank raised
            return {"error": f"{type(e).__name__}: {e}", "presynced": emb.padded_presyncs > before}
        ((out**2).sum() / 64).backward()
    return {"error": None}


UNEVEN = {0: [8] * 8, 1: [8, 8, 8, 5, 8, 8, 0, 8]}
EVEN = {0: [8] * 6, 1: [8] * 6}


def _custom_loops(env, _) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """Every custom-loop case on one pair of ranks (one spawn): each builds its own table;
    the cases that raise go last."""
    return {
        "uneven_padded": _direct_loop(env, None, UNEVEN, "padded"),
        "uneven_exact": _direct_loop(env, None, UNEVEN, "exact"),
        "told_even": _direct_loop(env, True, EVEN, "padded"),
        "over_padded": _over_capacity(env, "padded"),
        "over_exact": _over_capacity(env, "exact"),
        **{f"bad_{o}": _bad_input_told(env, o) for o in ("sgd", "adagrad")},
    }


def test_custom_loops_meet_their_peers_in_one_path() -> None:
    """Loops calling the table directly (no trainer), payloads in peer memory on gloo ranks;
    before each fix the ranks' paths differed at some step (on gloo both paths still meet:
    on 2 H100s that was a wait until NCCL's watchdog).

    * Never told whether batches are full, with unequal batch sizes (rank 1's short, then
      empty, batches beside rank 0's full ones): no rank takes the pre-sync path (rank 0 took
      it alone at rank 1's short batch), and training equals the exact transport's; told
      that every batch is full, equal batches take it (the mode the trainer uses).
    * Capacities fixed as an epoch's scan fixes them, then batches it never saw, rank 1's
      over the fixed distinct rows: that batch asks for the exact transport in its sizes
      table, so every rank takes it (that rank alone refused the padded step after the sizes
      exchange, "distinct rows exceed the fixed ..."); training equals the exact transport's.
    * Told that every batch is full, a rank whose input is malformed (float ids) plans a
      stand-in of the last batch's shape flagged bad and takes its peers' pre-sync path, so
      every rank fails at that step's sizes exchange (it took the exact path's sizes
      exchange), SGD and Adagrad."""
    import torch

    r0, r1 = spawn_ranks(_custom_loops, 2, None, timeout_s=120)

    def same_rows(p: dict, e: dict) -> None:  # type: ignore[type-arg]
        for k, v in e["sd"].items():
            torch.testing.assert_close(p["sd"][k], v, rtol=1e-5, atol=1e-6, msg=k)

    for r in (r0, r1):
        assert r["uneven_padded"]["presynced"] == [0] * 8, r["uneven_padded"]["presynced"]
        same_rows(r["uneven_padded"], r["uneven_exact"])
        assert sum(r["told_even"]["presynced"]) >= 4, r["told_even"]["presynced"]
        assert r["over_padded"]["built"] >= 1, r["over_padded"]  # (other steps: fixed buffers)
        same_rows(r["over_padded"], r["over_exact"])
    for o in ("sgd", "adagrad"):
        bad0, bad1 = r0[f"bad_{o}"], r1[f"bad_{o}"]
        assert bad1["error"] is not None and "int64" in bad1["error"], bad1
        assert bad0["error"] is not None and "rank(s) [1]" in bad0["error"], bad0
        assert bad0["presynced"] and bad1["presynced"], (o, bad0, bad1)  # (the same path)
