"""The compact fixed-shape lookup of multi-hot bags (``BagLayout.compact``, switched by
``hetgmp.train.multi_hot.COMPACT``; issue 34): the table is handed the single-hot ids and the
batch's bag values packed into a fixed capacity C, the rest filled with rows the batch holds.

It must pool exactly what the variable layout pools, and hand the table the same gradient per
row (the tail's is zero), with the torch reference and the Triton kernels (interpreter); a
batch over C takes the variable layout eagerly; the capacity is set once from an epoch's
batches; and in the multi-rank whole step on gloo ranks it trains exactly like the eager
padded path with the same layout (some batches over C), and at bound 0 like the variable
layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from interpreted import run_interpreted
from test_whole_step_bags import bags_runs_equal
from test_whole_step_multi import _assert_runs_equal, _rank
from torch import nn

from hetgmp.comm.spawn import spawn_ranks
from hetgmp.data.multi_hot_padded import PAD_ID
from hetgmp.models.pooling import BagLayout

F, WIDTHS, ROWS, D = 2, (4, 3), 40, 8


def _batch(seed: int, b: int = 6) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, ROWS, (b, F + sum(WIDTHS)), generator=g)
    col = F
    for w in WIDTHS:  # (each bag's values first, then padding; some bags empty)
        n = torch.randint(0, w + 1, (b,), generator=g)
        ids[:, col : col + w][torch.arange(w) >= n[:, None]] = PAD_ID
        col += w
    return ids


def _lookup(layout: BagLayout, ids: torch.Tensor, seed: int = 1) -> tuple[torch.Tensor, ...]:
    """The pooled rows of ``ids`` and the table's gradient per row for a fixed upstream one."""
    table = nn.Embedding(ROWS, D)
    with torch.no_grad():
        table.weight.copy_(torch.randn(ROWS, D, generator=torch.Generator().manual_seed(seed)))
    out = layout.lookup(lambda flat: table(flat), ids)  # ([N, 1] ids -> [N, 1, D] rows)
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1))
    (out * up).sum().backward()
    assert table.weight.grad is not None
    return out.detach(), table.weight.grad


def _layouts(capacity: int, backend: str = "torch") -> tuple[BagLayout, BagLayout]:
    kw = dict(num_single=F, widths=WIDTHS, pooling=("sum", "mean"), backend=backend)
    compact = BagLayout(**kw, fixed=True, compact=True)  # type: ignore[arg-type]
    compact.set_capacity(capacity)
    return compact, BagLayout(**kw)  # type: ignore[arg-type]


def _compare(backend: str) -> None:
    """Compact against variable on a few batches (a tail of 7 rows each)."""
    for seed in range(4):
        ids = _batch(seed)
        e = int((ids[:, F:] != PAD_ID).sum())
        compact, variable = _layouts(e + 7, backend)
        flat = compact.flat_ids(ids)
        assert flat.shape == (6 * F + e + 7, 1)  # (the capacity's shape, a tail of 7)
        assert set(flat[6 * F + e :, 0].tolist()) <= set(ids[ids != PAD_ID].tolist())
        got, want = _lookup(compact, ids), _lookup(variable, ids)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-6)  # (the tail adds 0)


def test_compact_pools_and_grads_as_the_variable_layout() -> None:
    _compare("torch")


def test_compact_with_the_triton_kernels_in_interpreter(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    text = "from test_bags_compact import _compare\n_compare('triton')\nprint('ok')\n"
    assert run_interpreted(tmp_path / "compact_check.py", text) == ["ok"]


def test_a_batch_over_the_capacity_takes_the_variable_layout() -> None:
    ids = _batch(3)
    e = int((ids[:, F:] != PAD_ID).sum())
    compact, variable = _layouts(e - 1)
    assert compact.flat_ids(ids).shape == (6 * F + e, 1)  # (eagerly: exact, not truncated)
    for got, want in zip(_lookup(compact, ids), _lookup(variable, ids), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_the_capacity_is_set_once_from_an_epochs_batches() -> None:
    layout = BagLayout(num_single=F, widths=WIDTHS, pooling=("sum", "sum"), fixed=True,
                       compact=True)  # fmt: skip
    sparse = torch.cat([_batch(s) for s in range(5)])  # (30 samples)
    need = layout.bag_values(sparse, torch.arange(30), 6).tolist()
    assert need == [int((_batch(s)[:, F:] != PAD_ID).sum()) for s in range(5)]
    assert all(layout.fit(need, 6))  # (the most + 2 % + 256, rounded to 256; at most B x W)
    assert layout.capacity == min(256 * -(-(max(need) * 102 // 100 + 256) // 256), 6 * 7)
    assert layout.capacity >= max(need) and layout.table_rows(6) == 6 * F + layout.capacity
    assert layout.fit([layout.capacity + 1], 6) == [False]  # (kept: a later epoch's overflow)
    off = BagLayout(num_single=F, widths=WIDTHS, pooling=("sum", "sum"), fixed=True)
    assert off.fit(need, 6) == [True] * 5 and off.capacity == 0  # (not compact: slots)
    assert off.table_rows(6) == 6 * (F + sum(WIDTHS))


def _rank_compact(env, cfg, whole: bool, layout: str) -> dict:  # type: ignore[no-untyped-def]
    from hetgmp.train import multi_hot

    if layout == "compact":  # (in the spawned ranks)
        multi_hot.FIXED_SHAPE = multi_hot.COMPACT = True
        multi_hot.COMPACT_CAPACITY = 104  # (a batch of 24 holds ~99 +- 9 values: some more)
    return _rank(env, cfg, whole, None)


@pytest.mark.parametrize(("optimizer", "bound"), [("adagrad", 0), ("sgd", 3)])
def test_whole_step_flow_with_compact_bags_trains_as_the_eager_path(
    tmp_path: Path, optimizer: str, bound: int
) -> None:
    cfg, _, whole = bags_runs_equal(tmp_path, _rank_compact, optimizer, bound, "compact")
    w0 = whole[0]
    assert w0["replays"] >= 4, w0  # (replayed: most batches fit)
    assert w0["eager"] > 2, w0  # (and some did not: eager, beside the warm-up)
    if bound == 0:  # (and what the variable layout trains: occurrence counts aside)
        variable = spawn_ranks(_rank_compact, 2, cfg, False, "variable", timeout_s=180)
        _assert_runs_equal(variable, whole, counters=False)


def test_one_rank_graph_sets_the_capacity_and_sends_batches_past_it_eager(
    tiny_dataset, monkeypatch
) -> None:
    """One CUDA rank (``multi_hot.ONE_RANK_COMPACT``): its bags take the compact fixed lookup,
    whose capacity the whole-step graph's epoch check sets from the resident samples (the
    trainer wires it when the bags are compact); a batch past it is not replayed."""
    from test_graphed_step import _cfg, _trainer

    from hetgmp.comm.env import DistEnv
    from hetgmp.train import multi_hot
    from hetgmp.train.graphed import GraphedStep

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(multi_hot, "ONE_RANK_COMPACT", False)
    assert not multi_hot._fixed_on(cuda, 1) and multi_hot._fixed_on(cuda, 2)
    monkeypatch.setattr(multi_hot, "ONE_RANK_COMPACT", True)
    assert multi_hot._fixed_on(cuda, 1) and not multi_hot._fixed_on(cpu, 1)
    assert not multi_hot._fixed_on(cuda, 1, host=True)  # (the tier: the variable layout)
    monkeypatch.setattr(multi_hot, "COMPACT", False)  # (fixed shapes pay only compact)
    assert not multi_hot._fixed_on(cuda, 1)

    graphed = GraphedStep(_trainer(_cfg(tiny_dataset.root), DistEnv.single()).train_step)
    assert not graphed.compact_bags()  # (no bags: the trainer sets no epoch check)
    graphed.step.model.bags = BagLayout(num_single=F, widths=WIDTHS, pooling=("sum", "mean"),
                                        fixed=True, compact=True)  # fmt: skip
    assert graphed.compact_bags()
    sparse = torch.cat([_batch(s) for s in range(5)])  # (30 samples, 5 batches of 6)
    need = [int((_batch(s)[:, F:] != PAD_ID).sum()) for s in range(5)]
    said: list[str] = []
    assert graphed.epoch_check(sparse, torch.arange(30), 6, said.append) == [True] * 5
    bags = graphed.step.model.bags
    assert bags.capacity >= max(need)
    assert len(said) == 1 and f"packed into {bags.capacity} table ids" in said[0], said
    bags.set_capacity(sorted(need)[2])  # (a later epoch's batches past a smaller capacity)
    fits = graphed.epoch_check(sparse, torch.arange(30), 6, said.append)
    assert fits == [n <= sorted(need)[2] for n in need]
    over = fits.count(False)
    assert len(said) == 2 and f"{over} of this epoch's 5 batches" in said[1], said  # (once)


def test_one_rank_compact_bags_without_resident_samples_take_the_variable_layout(
    tiny_dataset,
) -> None:
    """Compact bags get their capacity from resident samples only: with batches copied in
    (samples not resident), one rank's bags fall back to the variable layout and the dense
    part's graph, named in the log's reason, instead of padding every slot."""
    from types import SimpleNamespace

    from test_graphed_step import _cfg, _trainer

    from hetgmp.comm.env import DistEnv
    from hetgmp.train.graphed import GraphedStep

    tr = _trainer(_cfg(tiny_dataset.root), DistEnv.single())
    tr.model.bags = BagLayout(num_single=F, widths=WIDTHS, pooling=("sum", "mean"), fixed=True,
                              compact=True)  # fmt: skip
    graphed = GraphedStep(tr.train_step)
    tr.run_step = graphed
    tr._one_source(SimpleNamespace(name="prefetched batches"), graphed)  # type: ignore[arg-type]
    assert tr.model.bags is not None and not tr.model.bags.fixed and tr.model.bags.compact
    assert tr.run_step is tr.train_step
    assert tr.graph_note == "multi-hot bags: the samples are not resident (prefetched batches)"
