"""The padded lookup reading the rows stored here straight from the table
(:mod:`hetgmp.embedding.padded.take`, ``TAKE_FROM_TABLE``): its kernel equals the torch
reference in Triton's interpreter (a mutant that reads the wrong source fails), and on gloo
ranks the whole-step flow and the eager padded path train exactly as with every value written
by ``finish_values`` (torch segments, and the fused Triton segments in the interpreter)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from interpreted import run_interpreted
from test_whole_step_multi import (
    _assert_runs_equal,
    _rank,
    _switched_runs_equal,
    interpreted_runs,
    interpreter_now,
)

from hetgmp.embedding.padded.take import take_values_reference


def test_reference_reads_the_table_for_stored_rows_else_values() -> None:
    table = torch.arange(40.0).view(10, 4)
    values = -torch.arange(20.0).view(5, 4)
    src = torch.tensor([3, -1, 7, -1, 0])  # distinct rows 0, 2, 4 stored at slots 3, 7, 0
    inv = torch.tensor([0, 1, 1, 4, 2, 3])
    got = take_values_reference(table, src, values, inv)
    want = torch.stack([table[3], values[1], values[1], table[0], table[7], values[3]])
    assert torch.equal(got, want)


CASES = textwrap.dedent(
    """
    import types
    import torch
    import triton
    from interpreted import mutated_module
    import hetgmp.embedding.padded.kernels_triton as kt
    from hetgmp.embedding.padded import take
    from hetgmp.embedding.padded.take import take_values, take_values_reference

    def check():
        g = torch.Generator().manual_seed(0)
        table = torch.randn(300, 24, generator=g)
        values = torch.randn(90, 24, generator=g)
        src = torch.randint(-1, 300, (90,), generator=g)
        src[::3] = -1
        src[1] = 0  # (slot 0: a stored row too)
        inv = torch.randint(0, 90, (1000,), generator=g)
        st = types.SimpleNamespace(from_table=True, src=src,
                                   store=types.SimpleNamespace(weight_full=table))
        got = take_values(st, values, inv, backend="triton")
        bf = take_values(st, values, inv, backend="triton", out_dtype=torch.bfloat16)
        want = take_values_reference(table, src, values, inv)
        # (bf16 within one step: the interpreter may truncate, not round)
        close = torch.allclose(bf.float(), want, rtol=2**-7, atol=0)
        return torch.equal(got, want) and bf.dtype == torch.bfloat16 and close

    def mutant(old, new):
        mod = mutated_module(kt, old, new)
        real, take._kernel = take._kernel, lambda: (triton, mod.take_values_kernel)
        try:
            return check()
        finally:
            take._kernel = real

    print("real", check())
    print("slot0", mutant("rmask & (s >= 0), D, BLOCK_D)", "rmask & (s > 0), D, BLOCK_D)"))
    """
)


def test_kernel_matches_reference_in_interpreter(tmp_path: Path) -> None:
    out = run_interpreted(tmp_path / "take_checks.py", CASES)
    assert out == ["real", "True", "slot0", "False"]


def _rank_take(env, cfg, whole: bool, on: bool) -> dict:  # type: ignore[no-untyped-def]
    from hetgmp.embedding.padded import take

    take.TAKE_FROM_TABLE = on  # (in the spawned ranks)
    out = _rank(env, cfg, whole, None)
    out["from_table"] = on
    return out


@pytest.mark.parametrize(("whole", "optimizer", "bound"), [(True, "adagrad", 3), (False, "sgd", 0)])
def test_stored_rows_from_the_table_train_as_from_values(
    tiny_dataset, tmp_path, whole: bool, optimizer: str, bound: int
) -> None:
    _switched_runs_equal(tiny_dataset, tmp_path, _rank_take, whole, optimizer=optimizer,
                         bound=bound)  # fmt: skip


def _interpreted_take(env, cfg) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """The whole-step flow with the fused Triton segments in Triton's interpreter, without and
    with the table read by the lookup."""
    interpreter_now()
    return _rank_take(env, cfg, True, False), _rank_take(env, cfg, True, True)


# (slow: the table read by the lookup is the default since 2026-11-27, so every interpreted
# whole-step test runs it; this one checks it against the values path, now the switch's off)
@pytest.mark.slow
def test_fused_finish_and_take_from_the_table_in_interpreter(tiny_dataset, tmp_path) -> None:
    pytest.importorskip("triton")
    runs = interpreted_runs(tiny_dataset, tmp_path, _interpreted_take)
    _assert_runs_equal([r[0] for r in runs], [r[1] for r in runs])
