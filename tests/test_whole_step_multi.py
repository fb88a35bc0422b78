"""The multi-rank whole-step graph's flow (hetgmp.train.graphed_multi) on spawned gloo ranks.

On CPU a "replay" runs the captured flow plainly: no host read of a step's sizes, every state in
fixed buffers, the gradient summed in backward, capacities fixed per epoch from the epoch's own
batches. Such a run must train exactly like the eager padded path (itself tested against one
process at bound 0), with a capacity cap that sends batches to the exact path, and count the
same rows and pushes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.config import validate
from hetgmp.partition.plan import Plan, save_plan
from hetgmp.train.config import TrainConfig
from hetgmp.train.graphed_multi import MultiRankGraphedStep
from hetgmp.train.run import build_trainer
from hetgmp.train.runlog import RunLog

COUNTS = ("rows_owned", "rows_mirror_fresh", "rows_mirror_stale_ok", "rows_remote", "pushes_sent")


def _plan(ds, world: int, path: Path) -> Path:
    """Random owners and samples; every rank mirrors half of the rows it does not own."""
    rng = np.random.default_rng(11)
    n, r = len(ds.train), ds.meta.num_embeddings
    dp = rng.integers(0, world, n).astype(np.int32)
    ep = rng.integers(0, world, r).astype(np.int32)
    mirrors = [rng.permutation(np.flatnonzero(ep != w)).astype(np.int64) for w in range(world)]
    return save_plan(Plan(dp, ep, mirrors, {"dataset_fingerprint": ds.fingerprint}), path)


def _rank(
    env: DistEnv, cfg: TrainConfig, whole: bool, max_q: int | None, ahead: bool = False,
    blind: bool = False,
) -> dict:  # fmt: skip
    """One rank's run; the whole-step graph in the strict order unless ``ahead`` (reads one
    step ahead, on by default where --bound >= 1: hetgmp.embedding.padded.ahead)."""
    from hetgmp.embedding.padded import ahead as read_ahead

    read_ahead.ENABLED = ahead
    tr = build_trainer(cfg, env, RunLog(active=False), _factory())
    if whole:
        if max_q is not None:
            assert tr.model.embedding.whole_step(max_q=max_q) is not None
        tr.use_whole_step_graph()
        assert isinstance(tr.run_step, MultiRankGraphedStep)
        tr.run_step.warmup = 1
        if blind:  # (not told of evaluations: rows exchanged early are dropped at each)
            tr.run_step.boundary = None
    res = tr.fit()
    emb = tr.model.embedding
    sd = emb.state_dict()
    out = {"ids": sd["ids"], "weight": sd["weight"], "opt": sd["opt_state"], "res": res}
    out["dense"] = {k: v.clone() for k, v in tr.model.dense_state_dict().items()}
    if whole:
        run = tr.run_step
        out["replays"], out["eager"] = run.replays, run.eager_steps
        out["planned"], out["early"] = run.replays_planned, run.replays_early
        out["dropped"] = run.ahead.dropped
        w = emb.whole_step()
        st = w.padded.static
        out["counted_early"] = st.counted_early if st is not None else 0
        out["routed"], out["cap"], out["max"] = w.routed, w.padded.frozen, w.epoch_max
    return out


def _factory():
    from hetgmp.train.run import distributed_embedding

    return distributed_embedding


def _cfg(ds_root: Path, plan: Path, **kw) -> TrainConfig:
    base = dict(
        dataset=str(ds_root), partition=str(plan), batch_size=24, embed_dim=4, progress=False,
        lr=0.1, dense_optimizer="sgd", dense_lr=0.05, warmup_steps=1, threads=1, val=False,
        epochs=2, store_rate=0.5, replies="all", exchange="padded", data_on_device="on",
        log_every=50,
    )  # fmt: skip
    base.update(kw)
    return validate(TrainConfig(**base))


def _by_id(r: dict) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.argsort(r["ids"])
    opt = r["opt"][order] if r["opt"].numel() else r["opt"]  # (SGD: no state)
    return r["weight"][order], opt


def _assert_runs_equal(eager: list[dict], whole: list[dict], *, counters: bool = True) -> None:
    """Every rank's rows, optimizer state and dense layers equal (to float summation order),
    and rank 0's row and push counters (``counters``)."""
    for e, w in zip(eager, whole, strict=True):
        assert torch.equal(e["ids"], w["ids"])
        for got, want in zip(_by_id(w), _by_id(e), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        for k in e["dense"]:
            torch.testing.assert_close(w["dense"][k], e["dense"][k], rtol=0, atol=1e-6, msg=k)
    if counters:
        got, want = whole[0]["res"]["embedding_counters"], eager[0]["res"]["embedding_counters"]
        for k in COUNTS:
            assert got[k] == want[k], (k, got, want)


def _switched_runs_equal(
    ds,
    tmp_path: Path,
    rank_fn,
    whole: bool,
    **kw,  # type: ignore[no-untyped-def]
) -> tuple[list[dict], list[dict]]:
    """Two 2-rank runs of ``rank_fn(env, cfg, whole, on)`` (a switch off, then on) on a random
    plan: their rows, state, dense layers and counters equal, and the rows moved (not
    vacuous). Returns both runs."""
    cfg = _cfg(ds.root, _plan(ds, 2, tmp_path / "part.npz"), **kw)
    off = spawn_ranks(rank_fn, 2, cfg, whole, False, timeout_s=180)
    on = spawn_ranks(rank_fn, 2, cfg, whole, True, timeout_s=180)
    _assert_runs_equal(off, on)
    ww = _by_id(on[0])[0]
    assert (ww - ww.mean()).abs().max() > 0
    return off, on


@pytest.mark.parametrize(
    ("optimizer", "bound", "max_q", "evals"),
    [("adagrad", 0, None, 0), ("sgd", 3, None, 0), ("adagrad", 3, 20, 0), ("adagrad", 3, None, 5)],
)
def test_whole_step_flow_trains_as_the_eager_padded_path(
    tiny_dataset, tmp_path, optimizer: str, bound: int, max_q: int | None, evals: int
) -> None:
    """Rows, optimizer state, dense layers and row counters equal the eager padded path's
    (``max_q=20``: a cap under some batches' queries, so those take the exact path and the
    next step its pushes: the routing is exercised; ``evals``: an evaluation every that many
    steps, each flushing a replayed step's gradient through the exact path)."""
    plan = _plan(tiny_dataset, 2, tmp_path / "part.npz")
    more = {"val": True, "eval_every": evals} if evals else {}
    cfg = _cfg(tiny_dataset.root, plan, optimizer=optimizer, bound=bound, **more)
    eager = spawn_ranks(_rank, 2, cfg, False, None, timeout_s=180)
    whole = spawn_ranks(_rank, 2, cfg, True, max_q, timeout_s=180)
    _assert_runs_equal(eager, whole)
    w0 = whole[0]
    if evals:
        assert w0["res"]["val_auc"] == eager[0]["res"]["val_auc"]
    if max_q is None:
        assert w0["replays"] >= 4 and w0["routed"] == 0, w0
        # planned one step ahead and exchanged right after the last step's backward (exact:
        # the same rows, state and counters as the eager path, above)
        assert w0["planned"] >= 2 and w0["early"] > w0["planned"], w0  # (+ epochs' last steps)
    else:
        assert w0["replays"] > 0 and w0["routed"] > 0 and w0["cap"].q == max_q, w0
    res = w0["res"]  # (an epoch start's scan time, the median, within the run's sum)
    assert 0 <= res["epoch_scan_ms_median"] <= 1e3 * res["epoch_scan_s"] + 1e-9, res
    # the comparison is not vacuous: the rows moved
    ww = _by_id(w0)[0]
    assert (ww - ww.mean()).abs().max() > 0


def test_rows_exchanged_early_are_dropped_when_an_evaluation_changed_the_table(
    tiny_dataset, tmp_path
) -> None:
    """A step exchanges the next batch right after its backward (hetgmp.embedding.padded.ahead);
    the trainer says where an evaluation follows, and there it does not (the evals case
    above: equal to the eager path). Not told (``blind``), the evaluation in between (which
    pushes the mirrors' deferred updates) makes the rows exchanged early older than the
    table: each such step drops them and reads again. (The early exchange applied the
    gradient before the evaluation's flush rather than with it: with SGD, whose updates add,
    the same rows; an Adagrad step of a sum is not two steps.)"""
    plan = _plan(tiny_dataset, 2, tmp_path / "part.npz")
    cfg = _cfg(tiny_dataset.root, plan, bound=3, val=True, eval_every=4, optimizer="sgd")
    eager = spawn_ranks(_rank, 2, cfg, False, None, timeout_s=180)
    whole = spawn_ranks(_rank, 2, cfg, True, None, False, True, timeout_s=180)
    # (evaluations after steps 4, 8, 12 and 16 of 18; the ones after a step that exchanged
    # early: the first epoch's steps are eager at first)
    assert whole[0]["dropped"] == whole[1]["dropped"] >= 2, whole[0]["dropped"]
    # (rows and dense layers; the counters count the dropped exchanges too)
    _assert_runs_equal(eager, whole, counters=False)


def interpreter_now() -> None:
    """(In a rank started fresh, ``start_method="spawn"``) Triton's kernels in its interpreter
    from here: set before triton's first import, which reads the switch."""
    import os
    import sys

    os.environ["TRITON_INTERPRET"] = "1"
    assert "triton" not in sys.modules  # (its own jit helpers read the switch at import)
    from hetgmp.embedding.kernels import launcher, prep

    launcher.interpreted.cache_clear()  # (read when hetgmp was imported, unpickling this)
    # (their interpreter defaults, "not interpreted()", read when prep was imported, which may
    # be before the switch: the in-program sorts run as Python in the interpreter, the marking
    # by field's were ~45 % of an interpreted flow's time; tests/test_prep_kernels.py checks it)
    prep.AGGREGATE = prep.MARK_BY_FIELD = False
    assert "hetgmp.embedding.kernels.rows_triton" not in sys.modules  # (jit-decorated later)


def interpreted_runs(ds, tmp_path: Path, rank_fn, **kw) -> list:  # type: ignore[no-untyped-def]
    """``rank_fn(env, cfg)`` on 2 fresh gloo ranks (it calls :func:`interpreter_now` first),
    with the fused Triton segments, one epoch of a random plan; ``kw``: config overrides
    (default Adagrad at bound 3). Returns each rank's result."""
    plan = _plan(ds, 2, tmp_path / "part.npz")
    cfg = _cfg(ds.root, plan, **{"optimizer": "adagrad", "bound": 3, "kernels": "triton",
                                 "epochs": 1, **kw})  # fmt: skip
    # (420 s: two such interpreted runs side by side under pytest -n 2 take ~240 s each)
    return spawn_ranks(rank_fn, 2, cfg, timeout_s=420, start_method="spawn")


def _runs_interpreted(env: DistEnv, cfg: TrainConfig) -> tuple[dict, dict]:
    """:func:`_rank`'s eager run, then its whole-step run, with Triton's kernels in its
    interpreter."""
    interpreter_now()
    return _rank(env, cfg, False, None), _rank(env, cfg, True, None)


# (SGD's run, ~30 s in the interpreter, under -m slow: Adagrad's takes the same path and more)
@pytest.mark.parametrize("optimizer", [pytest.param("sgd", marks=pytest.mark.slow), "adagrad"])
def test_early_counts_phase_with_fused_kernels_trains_as_the_eager_path(
    tiny_dataset, tmp_path, optimizer: str
) -> None:
    """With the fused Triton segments (in Triton's interpreter) the next exchange's counts
    phase and sizes exchange run during the forward, before the gradient exists
    (hetgmp.embedding.padded.presync_step): rows, state, dense layers and counters equal the
    eager padded path's, which runs every pre-sync part in order."""
    pytest.importorskip("triton")
    runs = interpreted_runs(tiny_dataset, tmp_path, _runs_interpreted, optimizer=optimizer)
    eager, whole = [r[0] for r in runs], [r[1] for r in runs]
    _assert_runs_equal(eager, whole)
    assert whole[0]["counted_early"] >= 2 and whole[0]["early"] >= 2, whole[0]


def test_read_ahead_takes_exact_rows_only_when_no_step_ran_since() -> None:
    """The rule that keeps rows exchanged early exact: taken by the batch whose ids they
    were exchanged for, with no gradient pending and no step run since; else dropped."""
    from hetgmp.embedding.padded.ahead import Primed, ReadAhead

    ahead = ReadAhead(torch.device("cpu"))
    ids = torch.zeros(2, 3, dtype=torch.int64)

    def primed(at: int) -> Primed:
        prep = type("P", (), {"ids": ids})()
        p = Primed(prep, torch.zeros(1), object(), object(), exact=True)  # type: ignore[arg-type]
        ahead.primed, ahead.primed_at = p, at
        return p

    p = primed(5)
    assert ahead.take(ids, None, 5) is p and ahead.primed is None
    primed(5)
    assert ahead.take(ids, None, 6) is None  # (a step ran since: an evaluation, a flush)
    primed(5)
    assert ahead.take(ids, (object(), None), 5) is None  # (a gradient pending)
    primed(5)
    assert ahead.take(ids.clone(), None, 5) is None  # (another batch's ids)
    assert ahead.dropped == 3


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_whole_step_cuda_graph_on_two_gpus(tmp_path) -> None:
    """The captured multi-rank step (NCCL inside the graph) against the eager one, under
    torchrun (tests/gpu_whole_step_check.py)."""
    _torchrun_check("gpu_whole_step_check.py", tmp_path, "WHOLE STEP CHECK OK")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_ranks_with_unequal_batch_counts_on_two_gpus(tmp_path) -> None:
    """A plan that leaves rank 1 partial and empty batches while rank 0's are full: the
    captured step trains as the eager one, no hang (tests/gpu_uneven_check.py)."""
    _torchrun_check("gpu_uneven_check.py", tmp_path, "UNEVEN CHECK OK")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_custom_loops_meet_their_peers_on_two_gpus(tmp_path) -> None:
    """Loops calling the table directly with unequal batches, capacities overrun on one rank
    and bad input on one rank: every rank in one path, no hang (tests/gpu_custom_loop_check.py)."""
    _torchrun_check("gpu_custom_loop_check.py", tmp_path, "CUSTOM LOOP CHECK OK")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_dense_copy_rides_the_exchange_barriers_on_two_gpus(tmp_path) -> None:
    """The dense gradients' copy certified by the exchange's barriers (SHARED_BARRIER)
    against NCCL's all-reduce, under torchrun (tests/gpu_shared_barrier_check.py)."""
    _torchrun_check("gpu_shared_barrier_check.py", tmp_path, "SHARED BARRIER CHECK OK")


def _rank_ahead(env: DistEnv, cfg: TrainConfig, ahead: bool) -> dict:
    out = _rank(env, cfg, True, None, ahead)
    tr_emb_ahead = out.pop("ahead", None)
    assert tr_emb_ahead is None
    return out


def _rank_ahead_counts(env: DistEnv, cfg: TrainConfig) -> dict:
    from hetgmp.embedding.padded import ahead as read_ahead

    read_ahead.ENABLED = True
    tr = build_trainer(cfg, env, RunLog(active=False), _factory())
    tr.use_whole_step_graph()
    run = tr.run_step
    assert isinstance(run, MultiRankGraphedStep)
    run.warmup = 1
    res = tr.fit()
    keys = sorted(run._entries)
    return {"res": res, "ahead": run.replays_ahead, "keys": keys, "replays": run.replays}


@pytest.mark.parametrize("optimizer", ["adagrad"])  # (reading ahead: a diagnosis, off)
def test_reading_ahead_trains_and_bound_0_keeps_the_strict_order(
    tiny_dataset, tmp_path, optimizer: str
) -> None:
    """With reads one step ahead on (hetgmp.embedding.padded.ahead): at bound 3 most full
    steps replay the graph that reads ahead (its rows were exchanged during the last step),
    training still learns, and the counters still add up; at bound 0 nothing reads ahead and
    the run equals the eager padded path exactly."""
    plan = _plan(tiny_dataset, 2, tmp_path / "part.npz")
    cfg = _cfg(tiny_dataset.root, plan, optimizer=optimizer, bound=3, epochs=3)
    got = spawn_ranks(_rank_ahead_counts, 2, cfg, timeout_s=180)
    for r in got:
        # steps 2..7 of each 9-step epoch (the first after an epoch start is eager, the
        # last two have no full next batch): piped keys exist and most rows came primed
        assert any(key[1] for key in r["keys"])  # (slot, piped, last), r["keys"]
        assert r["ahead"] >= 10, r["ahead"]
    assert got[0]["ahead"] == got[1]["ahead"]  # (every rank decides the same)
    c = got[0]["res"]["embedding_counters"]
    assert c["rows_owned"] > 0 and c["pushes_sent"] > 0
    strict = _cfg(tiny_dataset.root, plan, optimizer=optimizer, bound=0)
    eager = spawn_ranks(_rank, 2, strict, False, None, timeout_s=180)
    whole = spawn_ranks(_rank_ahead, 2, strict, True, timeout_s=180)
    for e, w in zip(eager, whole, strict=True):
        torch.testing.assert_close(_by_id(w)[0], _by_id(e)[0], rtol=0, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_reading_ahead_in_the_cuda_graph_on_two_gpus(tmp_path) -> None:
    """The captured step that reads ahead (a side stream, NCCL on two communicators) trains
    as well as the strict one, under torchrun (tests/gpu_read_ahead_check.py)."""
    _torchrun_check("gpu_read_ahead_check.py", tmp_path, "READ AHEAD CHECK OK")


def _torchrun_check(script: str, tmp_path: Path, ok: str) -> None:
    """Run ``tests/<script> DIR`` on 2 GPUs under torchrun; it must print ``ok``."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", str(root / "tests" / script), str(tmp_path / "data")]  # fmt: skip
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert got.returncode == 0 and ok in got.stdout, got.stdout + got.stderr
