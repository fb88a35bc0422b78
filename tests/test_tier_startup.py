"""The host tier's start-up and residency decisions stay vectorised (issue 33: at 33.8M rows
the start-up took minutes, the initial rows being hashed by a torch op per temporary and on
the CPU). No timings: the guards count Python-level calls, which a per-row loop would make
grow with the table, and check every shortcut against the plain computation it replaces."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from hetgmp.embedding import init as init_mod
from hetgmp.embedding.init import _shr, initial_rows, splitmix64
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.tier_host import SetupClock, hottest_first
from hetgmp.embedding.tier_setup import tiered_store
from hetgmp.embedding.tiered import TieredRows

CPU = torch.device("cpu")


def _plain_rows(ids: torch.Tensor, dim: int, seed: int, scale: float) -> torch.Tensor:
    """The initial rows as first written: whole-tensor ops, one temporary each."""
    key = int(splitmix64(torch.tensor([seed], dtype=torch.int64))[0])
    ctr = ids.to(torch.int64)[:, None] * dim + torch.arange(dim, dtype=torch.int64)[None, :]
    u = (_shr(splitmix64(ctr ^ key), 40).to(torch.float64) + 0.5) / float(1 << 24)
    return ((2.0 * u - 1.0) * scale).to(torch.float32)


@pytest.mark.parametrize("chunk", [7, 64, 1 << 15])
@pytest.mark.parametrize("scale", [0.01, 1 / 3, 5.0])
def test_initial_rows_are_the_plain_formula_bit_for_bit(
    chunk: int, scale: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = torch.tensor([0, 1, 5, 999, 2**31 + 7, 2**40, 2**62 - 1, 123456789])
    monkeypatch.setattr(init_mod, "CHUNK_ELEMS", chunk)  # (chunks of 1 row up to all rows)
    got = initial_rows(ids, 13, seed=4, scale=scale)
    assert torch.equal(got.view(torch.int32), _plain_rows(ids, 13, 4, scale).view(torch.int32))
    out = torch.full((ids.numel(), 13), float("nan"))
    assert initial_rows(ids, 13, seed=4, scale=scale, out=out, compute=CPU) is out
    assert torch.equal(out, got)
    assert float(got.abs().max()) < scale and len(torch.unique(got)) > 90  # (not constant)


def test_initial_rows_refuses_a_wrong_out() -> None:
    with pytest.raises(ValueError, match=r"out must be float32 \[3, 4\]"):
        initial_rows(torch.arange(3), 4, seed=0, scale=0.1, out=torch.empty(3, 5))


def test_initial_rows_hash_a_chunk_per_call_not_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = init_mod._Workspace.hash

    def counted(self: Any, ids: torch.Tensor, *a: Any) -> torch.Tensor:
        calls.append(ids.numel())
        return real(self, ids, *a)

    monkeypatch.setattr(init_mod._Workspace, "hash", counted)
    rows, dim = 50_000, 16
    initial_rows(torch.arange(rows), dim, seed=1, scale=0.1)
    per = init_mod.CHUNK_ELEMS // dim
    assert calls == [per] * (rows // per) + [rows % per]  # (2048 rows a call here)


def _python_calls(fn: Callable[[], Any]) -> int:
    """Python lines run and functions called (C ones too) while ``fn`` runs: a loop in
    Python runs at least a line per pass, whatever it calls."""
    n = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal n
        n += 1
        return trace

    def prof(frame: Any, event: str, arg: Any) -> None:
        nonlocal n
        n += event == "c_call"

    sys.setprofile(prof)
    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return n


def _setup(rows: int, world: int = 1) -> Callable[[], Any]:
    opt = SparseOptimizer("adagrad", 0.1, 1e-10, 0.0, "torch")
    counts = torch.from_numpy(np.random.default_rng(0).zipf(1.5, rows) % 50)
    owner = (np.arange(rows) % world).astype(np.int64)
    return lambda: tiered_store(
        rows, 8, rank=0, world=world, device=CPU, owner=owner, opt=opt, seed=0,
        mirrors=np.zeros(0, np.int64), init_scale=0.1, cache_budget=0.1, counts=counts,
    )  # fmt: skip


@pytest.mark.parametrize("world", [1, 2])
def test_tier_setup_makes_no_python_call_per_row(
    world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(init_mod, "CHUNK_ELEMS", 1 << 30)  # (one hashing chunk at any size)
    small, large = (_python_calls(_setup(n, world)) for n in (2_000, 200_000))
    # a loop over rows (or cache slots) would add ~198,000 calls; chunked ops add none
    assert large - small < 50, (small, large)


def _lookups(budget: int) -> Callable[[], Any]:
    n = 20 * budget
    opt = SparseOptimizer("sgd", 0.1, 1e-10, 0.0, "torch")
    tier = TieredRows(torch.zeros(n, 4), torch.zeros(0), device=CPU, budget=budget, opt=opt)
    batches = [torch.randint(0, n, (64, 3), generator=torch.Generator().manual_seed(i))
               for i in range(4)]  # fmt: skip

    def run() -> None:
        for b in batches:  # (cold: misses and evictions every step)
            tier.lookup(b)
            tier.updated()

    return run


def test_residency_decisions_make_no_python_call_per_slot() -> None:
    small, large = (_python_calls(_lookups(b)) for b in (1_000, 100_000))
    assert large - small < 50, (small, large)


def test_hottest_first_is_the_stable_descending_sort() -> None:
    rng = np.random.default_rng(5)
    for zeros in (0.0, 0.5, 0.99, 1.0):
        c = torch.from_numpy(rng.integers(1, 6, 3000) * (rng.random(3000) >= zeros))
        assert torch.equal(hottest_first(c, 3000), torch.argsort(c, descending=True, stable=True))
    neg = torch.tensor([0, -2, 3, 0, -1])  # (negative counts: the plain sort)
    assert hottest_first(neg, 5).tolist() == [2, 0, 3, 4, 1]
    assert hottest_first(None, 3).tolist() == [0, 1, 2]


def test_setup_clock_reports_each_phase_once_parseably() -> None:
    lines: list[str] = []
    store, tier, _ = _setup_with(SetupClock(lines.append))
    assert [ln.split()[3] for ln in lines] == ["init", "host", "cache"]
    assert lines[0].startswith(f"host tier setup: init rows 3000 bytes {3000 * 4 * 9} elapsed_s ")
    assert lines[2].startswith(f"host tier setup: cache rows 300 bytes {300 * 4 * 9} elapsed_s ")
    assert all(float(ln.rsplit(" ", 1)[1]) >= 0.0 for ln in lines)
    assert tier.budget == 300 and store.weight.shape == (3000, 8)


def _setup_with(clock: SetupClock) -> Any:
    opt = SparseOptimizer("adagrad", 0.1, 1e-10, 0.0, "torch")
    return tiered_store(
        3000, 8, rank=0, world=1, device=CPU, owner=np.zeros(3000, np.int64), opt=opt, seed=0,
        mirrors=np.zeros(0, np.int64), init_scale=0.1, cache_budget=0.1, counts=None,
        clock=clock,
    )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_initial_rows_hashed_on_cuda_are_the_cpu_bits() -> None:
    ids = torch.cat([torch.arange(300_000), torch.tensor([2**40, 2**62 - 1])])
    cpu = initial_rows(ids, 128, seed=9, scale=0.01)
    out = torch.empty_like(cpu)
    initial_rows(ids, 128, seed=9, scale=0.01, out=out, compute=torch.device("cuda"))
    assert torch.equal(out.view(torch.int32), cpu.view(torch.int32))
