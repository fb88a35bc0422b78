"""The host tier decided on the device (:mod:`hetgmp.embedding.tier_device`, switched on by
``tier_setup.DEVICE_TIER``): trained through the trainer it equals the all-on-device table bit
for bit (val metrics, checkpointed rows and optimizer state), with real misses written back;
a larger batch grows its working table; bad ids are refused; and its Triton path (zero-copy
gathers that skip padding, write-backs) matches its torch path in Triton's interpreter."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from interpreted import run_interpreted

from hetgmp.embedding import tier_device, tier_setup
from hetgmp.embedding.errors import EmbeddingInputError
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.tier_device import DeviceTier
from hetgmp.train.checkpoint import open_checkpoint
from tests.test_tier_train import run, write_skewed


def _rows(ckdir: Path) -> list[torch.Tensor]:
    """A checkpoint's rows and optimizer state (none for SGD), in id order."""
    emb = open_checkpoint(ckdir).embedding_union()
    order = torch.argsort(emb["ids"])
    state = emb["opt_state"]
    return [emb["weight"][order]] + ([state[order]] if state.numel() else [])


@pytest.fixture
def skewed(tmp_path: Path) -> Path:
    return write_skewed(tmp_path / "skewed", [200, 500, 300], seed=3, power=3, n_train=480,
                        n_test=96)  # fmt: skip


@pytest.mark.parametrize(("optimizer", "adapt_every"), [("adagrad", 1000), ("sgd", 1000),
                                                        ("adagrad", 3)])  # fmt: skip
def test_trains_as_the_device_table(
    skewed: Path, tmp_path: Path, monkeypatch, optimizer: str, adapt_every: int
) -> None:
    dev, _ = run(skewed, optimizer=optimizer, checkpoint_dir=tmp_path / "dev")
    monkeypatch.setattr(tier_setup, "DEVICE_TIER", True)
    monkeypatch.setattr(tier_device, "ADAPT_EVERY", adapt_every)  # (3: cached rows re-picked)
    out = tmp_path / "r.json"
    res, _ = run(skewed, optimizer=optimizer, rows_on="host", cache_budget=0.15, output=out,
                 checkpoint_dir=tmp_path / "tier")  # fmt: skip
    assert res["val_auc"] == dev["val_auc"] and res["val_loss"] == dev["val_loss"]
    a, b = (_rows(tmp_path / n) for n in ("dev", "tier"))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))  # rows and state, by id
    t = json.loads(out.read_text())["host_tier"]
    assert t["cache_rows"] == 150 and t["table_rows"] == 1000
    assert t["misses"] > 0 and t["hits"] > 0 and t["written_back"] > 0
    assert (t["evictions"] > 0) == (adapt_every < 20)  # (re-picks replaced cached rows)


def test_counters_log_lines_and_memory_plan(skewed: Path, tmp_path: Path) -> None:
    """Through the trainer (the default one-rank tier): the results' tier counters, the TRAIN
    lines' tier fields, the setup phases, and the memory plan counting the miss entries
    reserved for the largest batch (16 samples x 3 ids) before training."""
    res, text = run(skewed, rows_on="host", cache_budget=0.15, output=tmp_path / "r.json")
    t = json.loads((tmp_path / "r.json").read_text())["host_tier"]
    row_bytes = 4 * (4 + 1)  # dim 4 + Adagrad's state
    assert t["steps"] == 20 and t["cache_rows"] == 150 and t["table_rows"] == 1000
    assert t["hit_rate"] == t["hits"] / (t["hits"] + t["misses"]) and 0 < t["hit_rate"] < 1
    assert t["bytes_h2d_per_step"] == t["misses"] * row_bytes / 20 == t["bytes_d2h_per_step"]
    assert t["written_back"] == t["misses"] and t["host_bytes"] == 1000 * row_bytes
    lines = text.splitlines()
    assert [ln.split()[3] for ln in lines if ln.startswith("host tier setup: ")][1:] == [
        "init", "host", "cache"]  # fmt: skip
    assert "(15.0 %), " in text and "(rows, 48 miss entries, state, slot maps)" in text
    train = [ln for ln in lines if ln.startswith("TRAIN ")]
    assert len(train) == 2 and all("tier_hit " in ln and "tier_h2d_per_step " in ln for ln in train)


def _tier(budget: int = 3, kernels: str = "torch") -> tuple[DeviceTier, torch.Tensor]:
    weight = torch.arange(40.0).reshape(10, 4)
    opt = SparseOptimizer("adagrad", lr=0.1, kernels=kernels)
    counts = torch.tensor([0, 9, 0, 8, 0, 0, 7, 0, 0, 0])
    return DeviceTier(weight, torch.zeros(10), device=torch.device("cpu"), budget=budget,
                      opt=opt, counts=counts, kernels=kernels), weight  # fmt: skip


def test_lookup_gathers_misses_and_grows() -> None:
    tier, weight = _tier()
    assert tier.row_of.tolist() == [1, 3, 6]  # the hottest
    ids = torch.tensor([[1, 2], [2, 9]])
    slots = tier.lookup(ids)
    assert slots[0, 0] == 0 and slots[0, 1] == slots[1, 0] >= 3  # a missed row: one entry
    assert torch.equal(tier.cache_weight[slots], weight[ids])  # gathered from host memory
    tier.cache_weight[slots[1, 1]] += 100.0  # (the step's update of row 9's entry)
    tier.updated()
    assert weight[9, 0] == 136.0  # written back
    assert tier.slots == 3 + 4
    big = torch.arange(10).repeat(2).reshape(4, 5)  # 20 occurrences: the table grows
    slots = tier.lookup(big)
    assert tier.slots == 3 + 20 and torch.equal(tier.cache_weight[slots], weight[big])
    c = tier.counters
    assert (c.hits, c.misses, c.written_back, c.batches) == (1 + 3, 2 + 7, 2, 2)
    bad = tier.lookup(torch.tensor([[3, 10], [-1, 3]]))  # no device read: refused slots
    assert bad.tolist() == [[1, tier.slots], [tier.slots, 1]]


def test_captured_lookup_leaves_the_host_part_to_before_replay(monkeypatch) -> None:
    monkeypatch.setattr(tier_device, "ADAPT_EVERY", 2)
    tier, _ = _tier()
    ids = torch.tensor([[0, 2], [0, 9]])
    for _ in range(2):
        tier.lookup(ids)
        tier.updated()
    tier.lookup_captured(ids)  # (what a capture records: no count, no re-pick)
    assert tier.counters.batches == 2 and tier.adapted == 0
    tier.before_replay()  # the replay's host part: the re-pick was due
    assert tier.counters.batches == 3 and sorted(tier.row_of.tolist()) == [0, 2, 9]
    with pytest.raises(RuntimeError, match="exceeds"):
        tier.lookup_captured(torch.zeros(2, 3, dtype=torch.int64))  # (growing would move it)


def test_a_bad_id_is_refused_by_the_step_naming_it(monkeypatch) -> None:
    """The tier reads nothing back for a range check (a CUDA graph holds it): the step's range
    flag refuses the batch, naming the id, and the table trains on as the device table."""
    from hetgmp.comm.env import DistEnv
    from hetgmp.embedding import DistributedEmbedding

    monkeypatch.setattr(tier_setup, "DEVICE_TIER", True)
    g = torch.Generator().manual_seed(1)
    kw = dict(optimizer="adagrad", lr=0.05, cuda_graphs=False)
    ref = DistributedEmbedding(50, 4, DistEnv.single(), **kw)
    emb = DistributedEmbedding(50, 4, DistEnv.single(), rows_on="host", cache_budget=0.2, **kw)
    for t in range(4):
        ids = torch.randint(0, 50, (6, 3), generator=g)
        for m in (ref, emb):
            m(ids).pow(2).sum().backward()
        if t == 1:
            with pytest.raises(EmbeddingInputError, match="id 57 is outside"):
                emb(torch.tensor([[3, 57, 4]]))
    assert torch.equal(emb(ids), ref(ids))


CASES = textwrap.dedent(
    """
    import torch
    from tests.test_tier_device import _tier

    def check():
        g = torch.Generator().manual_seed(0)
        tiers = [_tier(4, k) for k in ("torch", "triton")]
        for _ in range(5):
            ids = torch.randint(0, 10, (6, 3), generator=g)
            for tier, _w in tiers:
                slots = tier.lookup(ids)
                tier.cache_weight[slots.reshape(-1)] *= 1.5
                tier.cache_state[slots.reshape(-1)] += 1.0
                tier.updated()
        (a, aw), (b, bw) = tiers
        assert torch.equal(aw, bw) and torch.equal(a.rows()[1], b.rows()[1])
        assert torch.equal(a.cache_weight[:4], b.cache_weight[:4])
        print("ok")
    """
)


def test_triton_path_matches_torch_in_interpreter(tmp_path: Path) -> None:
    assert run_interpreted(tmp_path / "tier_device_checks.py", CASES, calls=("check()",)) == ["ok"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graphs", [False, True])
def test_trains_as_the_device_table_on_gpu(
    skewed: Path, tmp_path: Path, monkeypatch, graphs: bool
) -> None:
    # (the GPU sums a row's gradient with atomics: equal to float rounding, not bit for bit;
    # with graphs the tier's lookup and write-back replay inside the step's graph, and the
    # cached rows are re-picked between replays)
    gpu = dict(device="cuda", cuda_graphs=graphs)
    dev, _ = run(skewed, checkpoint_dir=tmp_path / "dev", **gpu)
    monkeypatch.setattr(tier_setup, "DEVICE_TIER", True)
    monkeypatch.setattr(tier_device, "ADAPT_EVERY", 7)
    res, _ = run(skewed, rows_on="host", cache_budget=0.15, checkpoint_dir=tmp_path / "tier",
                 **gpu)  # fmt: skip
    why = (res.get("step_graph"), dev.get("step_graph"))
    assert (res["graph_replays"] > 0) == graphs == (dev["graph_replays"] > 0), why
    assert abs(res["val_loss"] - dev["val_loss"]) < 1e-5
    for a, b in zip(_rows(tmp_path / "dev"), _rows(tmp_path / "tier"), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
