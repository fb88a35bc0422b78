"""Multi-hot bags in the multi-rank whole step (issue 34; :mod:`hetgmp.train.graphed_multi`),
on spawned gloo ranks, where a "replay" runs the captured flow plainly.

With bags in fixed shapes (``multi_hot.FIXED_SHAPE``: every bag slot handed to the table as an
``[N, 1]`` batch, padding standing in for the sample's own rows) the whole-step flow must train
exactly like the eager padded path (itself equal to one process at bound 0:
``tests/test_train_multi_hot_dist.py``): rows, optimizer state, dense layers and row counters,
with the steps replayed, the next batch planned ahead from its table ids and every primed plan
taken (the batch's ids pinned to the plan's; unpinned, they would all be dropped). The compact
lookup (its size the batch's) is refused."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_train_multi_hot import _data
from test_whole_step_multi import _assert_runs_equal, _by_id, _cfg, _plan, _rank

from hetgmp.comm.spawn import spawn_ranks
from hetgmp.data.format import open_dataset


def _rank_fixed(env, cfg, whole: bool) -> dict:  # type: ignore[no-untyped-def]
    from hetgmp.train import multi_hot

    multi_hot.FIXED_SHAPE = True  # (in the spawned ranks)
    # (every slot padded: the compact form, the default on several CUDA ranks, has its own
    # tests, test_bags_compact.py; here an eager run would never set its capacity)
    multi_hot.COMPACT = False
    return _rank(env, cfg, whole, None)


def bags_runs_equal(
    tmp_path: Path, rank_fn: Any, optimizer: str, bound: int, *args: Any
) -> tuple[Any, list[dict], list[dict]]:
    """A multi-hot set on 2 gloo ranks, the eager padded path and the whole-step flow of
    ``rank_fn(env, cfg, whole, *args)``, equal (rows, state, dense layers, counters); returns
    the config and both runs."""
    root = _data(tmp_path / "mh").root
    plan = _plan(open_dataset(root), 2, tmp_path / "part.npz")
    cfg = _cfg(root, plan, optimizer=optimizer, bound=bound, model="wdl", pooling="sum,mean")
    eager = spawn_ranks(rank_fn, 2, cfg, False, *args, timeout_s=180)
    whole = spawn_ranks(rank_fn, 2, cfg, True, *args, timeout_s=180)
    _assert_runs_equal(eager, whole)
    return cfg, eager, whole


@pytest.mark.parametrize(("optimizer", "bound"), [("adagrad", 0), ("sgd", 3)])
def test_whole_step_flow_with_fixed_bags_trains_as_the_eager_path(
    tmp_path: Path, optimizer: str, bound: int
) -> None:
    _, _, whole = bags_runs_equal(tmp_path, _rank_fixed, optimizer, bound)
    w0 = whole[0]
    assert w0["replays"] >= 4 and w0["routed"] == 0, w0  # (replayed, none sent to exact)
    # (the next batch planned from its table ids and exchanged right after backward, every
    # primed plan taken: the batch's ids pinned to the plan's)
    assert w0["planned"] >= 2 and w0["early"] > w0["planned"] and w0["dropped"] == 0, w0
    ww = _by_id(w0)[0]
    assert (ww - ww.mean()).abs().max() > 0  # (the rows moved: not vacuous)


def test_compact_bags_are_refused_by_the_whole_step(monkeypatch: pytest.MonkeyPatch) -> None:
    import hetgmp.train.graphed as graphed

    cfg = SimpleNamespace(cuda_graphs=True, dense_optimizer="adam", dense_sync_every=1)
    bags = SimpleNamespace(fixed=False)
    model = SimpleNamespace(embedding=SimpleNamespace(exchange="padded"), bags=bags)
    step: Any = SimpleNamespace(env=SimpleNamespace(device=torch.device("cuda")), model=model)
    monkeypatch.setattr(graphed, "engine_of", lambda _e: SimpleNamespace(kind="collective"))
    assert "fixed-shape lookup" in str(graphed.multi_graph_support(step, cfg))
    bags.fixed = True
    assert graphed.multi_graph_support(step, cfg) is None


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_whole_step_with_bags_cuda_graph_on_two_gpus(tmp_path: Path) -> None:
    """Several CUDA ranks with bags (``multi_hot.GPU_RANKS``): the captured step against the
    eager one under torchrun (tests/gpu_whole_step_bags_check.py)."""
    from test_whole_step_multi import _torchrun_check

    _torchrun_check("gpu_whole_step_bags_check.py", tmp_path, "WHOLE STEP BAGS CHECK OK")
