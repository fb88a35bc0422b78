"""The host tier (hetgmp/embedding/tiered.py) on CPU: a tiered table trained with random
batches with hot rows equals an all-resident one bit for bit, its counters add up, and a batch
larger than the cache is refused clearly."""

from __future__ import annotations

import pytest
import torch

from hetgmp.embedding import tier_setup
from hetgmp.embedding.errors import EmbeddingInputError
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.tiered import CacheBudgetError, TieredRows, budget_rows


@pytest.fixture(autouse=True)
def _host_decided(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are the host-decided tier's (:mod:`hetgmp.embedding.tiered`: several ranks'
    owned rows use it; one rank takes the device-decided one by default)."""
    monkeypatch.setattr(tier_setup, "DEVICE_TIER", False)


N, D = 2000, 8
CPU = torch.device("cpu")


def batches(steps: int, batch: int, seed: int) -> list[torch.Tensor]:
    """``[batch, 3]`` ids: a Zipf-like head (hot rows) plus uniform cold ids, so residency
    both hits and misses; the hot set drifts half way (residency must adapt)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in range(steps):
        hot = (torch.rand(batch, 2, generator=g) ** 3 * 200).long()
        if s >= steps // 2:
            hot = (hot + 700) % N  # drift: another hot set
        cold = torch.randint(0, N, (batch, 1), generator=g)
        out.append(torch.cat([hot, cold], 1))
    return out


def reference(opt: SparseOptimizer, weight: torch.Tensor, steps: list[torch.Tensor], seed: int):
    """The all-resident table: the same per-row sums and updates, on row ids."""
    w = weight.clone()
    st = opt.new_state(N, CPU)
    g = torch.Generator().manual_seed(seed)
    for ids in steps:
        grad = torch.randn(*ids.shape, D, generator=g) * (w[ids] + 0.1)
        uniq, inv = torch.unique(ids.reshape(-1), return_inverse=True)
        gsum = torch.zeros(uniq.numel(), D).index_add_(0, inv, grad.reshape(-1, D))
        opt.apply(w, st, uniq, gsum)
    return w, st


def tiered_run(opt, weight, steps, seed, budget, counts):
    t = TieredRows(weight, opt.new_state(N, CPU), device=CPU, budget=budget, opt=opt, counts=counts)
    g = torch.Generator().manual_seed(seed)
    for ids in steps:
        slots = t.prefetch(ids)
        assert torch.equal(t.row_of[slots], ids)  # every row of the batch is resident
        grad = torch.randn(*ids.shape, D, generator=g) * (t.gather(slots) + 0.1)
        t.apply(slots, grad)
    return t


@pytest.mark.parametrize("opt_name", ["adagrad", "sgd"])
@pytest.mark.parametrize("fraction", [0.05, 0.10, 0.25])
def test_tiered_equals_all_resident(opt_name: str, fraction: float) -> None:
    opt = SparseOptimizer(opt_name, lr=0.05, init=0.1)
    weight = torch.randn(N, D, generator=torch.Generator().manual_seed(1))
    steps = batches(40, 24, seed=2)
    counts = torch.bincount(torch.cat(steps[:5]).reshape(-1), minlength=N)  # "the plan's"
    budget = budget_rows(N, fraction)
    t = tiered_run(opt, weight, steps, 3, budget, counts)
    want_w, want_s = reference(opt, weight, steps, 3)
    got_w, got_s = t.rows()
    assert torch.equal(got_w, want_w)  # bit for bit
    assert torch.equal(got_s, want_s)
    c = t.counters
    distinct = sum(int(torch.unique(ids).numel()) for ids in steps)
    assert c.hits + c.misses == distinct
    assert c.hits > 0 and c.misses > 0
    # a miss fills an empty slot or evicts: the initial residents fill the cache
    assert c.evictions == c.misses
    assert c.bytes_h2d == c.misses * 4 * (D + opt.state_width)
    assert c.bytes_d2h == c.written_back * 4 * (D + opt.state_width)
    assert c.written_back <= c.evictions + budget
    # the cache and the maps agree: every resident row maps to its slot, and only those
    res = t.resident()
    assert (res >= 0).all() and torch.unique(res).numel() == budget
    assert torch.equal(t.slot_of[res], torch.arange(budget))
    assert int((t.slot_of >= 0).sum()) == budget


def test_initial_residents_are_the_most_frequent() -> None:
    opt = SparseOptimizer("adagrad")
    counts = torch.zeros(N, dtype=torch.int64)
    counts[[5, 77, 1999, 300]] = torch.tensor([10, 40, 30, 20])
    t = TieredRows(torch.zeros(N, D), opt.new_state(N, CPU), device=CPU, budget=3, opt=opt,
                   counts=counts)  # fmt: skip
    assert t.resident().tolist() == [77, 1999, 300]
    t.prefetch(torch.tensor([77, 1999, 300]))
    assert t.counters.hits == 3 and t.counters.misses == 0 and t.counters.bytes_h2d == 0


def test_eviction_gives_used_rows_a_second_chance_and_writes_back_only_updated_rows() -> None:
    """CLOCK (tier_clock.py): the hand starts at the last slot (the coldest initial
    resident) and moves down; a row hit since the hand last passed is kept once (its bit
    cleared), a row just loaded has no bit; only updated victims are written back."""
    opt = SparseOptimizer("sgd", lr=1.0)
    w = torch.zeros(10, D)
    t = TieredRows(w, opt.new_state(10, CPU), device=CPU, budget=3, opt=opt)
    assert t.resident().tolist() == [0, 1, 2]
    s = t.prefetch(torch.tensor([0, 1]))  # rows 0 and 1 referenced, 2 not
    t.apply(s[:1], torch.ones(1, D))  # row 0 updated
    t.prefetch(torch.tensor([5]))  # the hand at slot 2: row 2 has no bit
    assert t.resident().tolist() == [0, 1, 5]
    assert t.counters.evictions == 1 and t.counters.written_back == 0  # row 2 was clean
    t.prefetch(torch.tensor([6]))  # rows 1, 0 lose their bits; row 5 (just loaded) goes
    assert t.resident().tolist() == [0, 1, 6] and t.counters.written_back == 0
    t.prefetch(torch.tensor([7]))  # the hand at slot 1: row 1, its second chance used
    assert t.resident().tolist() == [0, 7, 6] and t.counters.written_back == 0
    t.prefetch(torch.tensor([7, 6]))  # (hits: rows 7 and 6 referenced)
    t.prefetch(torch.tensor([8]))  # slot 0: row 0, the updated one, written back
    assert t.resident().tolist() == [8, 7, 6]
    assert t.counters.written_back == 1 and t.counters.bytes_d2h == 4 * D
    assert torch.equal(t.host_weight[0], -torch.ones(D))
    back = t.prefetch(torch.tensor([0]))  # loaded again with its update (rows 7, 6 kept)
    assert torch.equal(t.gather(back), -torch.ones(1, D))
    assert t.resident().tolist() == [0, 7, 6]


def test_batch_larger_than_cache_is_refused_and_changes_nothing() -> None:
    opt = SparseOptimizer("adagrad")
    t = TieredRows(torch.randn(N, D), opt.new_state(N, CPU), device=CPU, budget=10, opt=opt)
    before = t.resident()
    with pytest.raises(CacheBudgetError, match=r"11 distinct rows.*holds 10 .*--cache-budget"):
        t.prefetch(torch.arange(100, 111).reshape(1, 11))
    assert torch.equal(t.resident(), before) and t.counters.misses == 0
    with pytest.raises(EmbeddingInputError, match=r"outside \[0, 2000\)"):
        t.prefetch(torch.tensor([3, N]))
    with pytest.raises(CacheBudgetError, match="1..2000"):
        TieredRows(torch.randn(N, D), opt.new_state(N, CPU), device=CPU, budget=0, opt=opt)
    with pytest.raises(CacheBudgetError, match=r"fraction in \(0, 1\]"):
        budget_rows(N, 1.5)


def _table(**kw):
    from hetgmp.comm.env import DistEnv
    from hetgmp.embedding import DistributedEmbedding

    return DistributedEmbedding(N, D, DistEnv.single(), optimizer="adagrad", lr=0.05,
                                init_scale=0.1, seed=4, **kw)  # fmt: skip


def test_one_rank_table_with_host_rows_trains_as_the_default() -> None:
    """The one-rank step with ``rows_on="host"`` (a 5 % cache, frequencies from the first
    batches) equals the all-on-device table bit for bit, checkpoint round trip included."""
    steps = batches(30, 24, seed=5)
    counts = torch.bincount(torch.cat(steps[:3]).reshape(-1), minlength=N)
    tables = [_table(), _table(rows_on="host", cache_budget=0.05, row_counts=counts)]
    for t in tables:
        g = torch.Generator().manual_seed(6)
        for i, ids in enumerate(steps):
            out = t(ids)
            (out * torch.randn(out.shape, generator=g)).sum().backward()
            if i == 15:  # a checkpoint round trip in the middle
                t.load_state_dict(t.state_dict())
    a, b = (t.state_dict() for t in tables)
    assert torch.equal(a["ids"], b["ids"])
    assert torch.equal(a["weight"], b["weight"]) and torch.equal(a["opt_state"], b["opt_state"])
    c = tables[1].tier.counters
    assert c.misses > 0 and c.evictions > 0 and c.written_back > 0
    with pytest.raises(EmbeddingInputError, match=r"rank 0: ids outside \[0, 2000\)"):
        tables[1](torch.tensor([[1, N]]))


def test_host_rows_refusals() -> None:
    with pytest.raises(ValueError, match="rows_on must be one of"):
        _table(rows_on="disk")
    with pytest.raises(CacheBudgetError, match=r"fraction in \(0, 1\]"):
        _table(rows_on="host", cache_budget=0.0)
    with pytest.raises(ValueError, match="one-rank step only"):
        _table(rows_on="host", audit=True)
    small = _table(rows_on="host", cache_budget=0.001)  # 2 rows
    with pytest.raises(CacheBudgetError, match="3 distinct rows"):
        small(torch.tensor([[1, 2, 3]]))
    from hetgmp.embedding.tier_setup import check_rows_on

    # (several ranks: the padded exchange too, its epoch holds in the whole-step graph: the
    # trainer refuses it outside that flow, tests/test_tier_epoch.py)
    check_rows_on("host", 0.1, world=2, device=CPU, cuda_graphs=False, exchange="padded")
    cuda = torch.device("cuda")
    check_rows_on("host", 0.1, world=2, device=cuda, cuda_graphs=True, exchange="padded")
    with pytest.raises(ValueError, match="CUDA graphs yet.*--no-cuda-graphs"):
        check_rows_on("host", 0.1, world=2, device=cuda, cuda_graphs=True, exchange="exact")
    with pytest.raises(ValueError, match="collective exchange only .*--sync async"):
        check_rows_on("host", 0.1, world=2, device=CPU, cuda_graphs=False, sync="async")
    with pytest.raises(ValueError, match="CUDA graphs yet.*--no-cuda-graphs"):
        check_rows_on("host", 0.1, world=1, device=torch.device("cuda"), cuda_graphs=True)


def test_training_with_host_rows_equals_the_default_run(tiny_dataset) -> None:
    """``--rows-on host --cache-budget 0.75`` (the CLI's table on the host tier, one rank on
    CPU; the tiny set has 70 rows; batches of 16, evaluation's too) trains to the same loss and AUC
    as the default run, bit for bit."""
    from hetgmp.comm.env import DistEnv
    from hetgmp.config import validate
    from hetgmp.train.config import TrainConfig
    from hetgmp.train.run import train

    def run(**kw: object) -> dict:
        cfg = validate(TrainConfig(dataset=str(tiny_dataset.root), batch_size=16, embed_dim=4,
                                   eval_batch_size=16, iter=30, progress=False, threads=1,
                                   **kw))  # fmt: skip
        return train(cfg, DistEnv.single())

    base, host = run(), run(rows_on="host", cache_budget=0.75)
    assert host["val_auc"] == base["val_auc"] and host["val_loss"] == base["val_loss"]
    assert host["config"]["rows_on"] == "host"


def test_a_cache_too_large_for_the_device_is_refused_before_allocating() -> None:
    from hetgmp.embedding.memory import TableMemoryError
    from hetgmp.embedding.tier_setup import check_cache_fits

    gib = 2**30
    # 100M rows of dim 128 + Adagrad: a 10 % cache is 5.2 GiB, the slot map 0.8 GiB
    check_cache_fits(100_000_000, 128, 0.10, 1, CPU, free=10 * gib)
    with pytest.raises(TableMemoryError, match=r"--cache-budget 0.5: .*take --cache-budget 0\.1"):
        check_cache_fits(100_000_000, 128, 0.5, 1, CPU, free=10 * gib)
    # the device-decided tier's maps (12 bytes a row): less room left for the cache
    import re

    said = {}
    for mb in (8, 12):
        with pytest.raises(TableMemoryError) as err:
            check_cache_fits(100_000_000, 128, 0.5, 1, CPU, free=10 * gib, map_bytes=mb)
        said[mb] = float(re.findall(r"take --cache-budget ([0-9.]+)", str(err.value))[0])
    assert said[12] < said[8]
