"""The next batch's occurrence rows written in the exchange's tail
(:mod:`hetgmp.embedding.padded.prefill`, ``PREFILL``): its two passes give exactly the lookup's
rows (:func:`~hetgmp.embedding.padded.take.take_values_reference` after finish) in torch and,
with their kernels, in Triton's interpreter (mutants that misread a row's block or skip the
second pass fail); on gloo ranks the whole-step flow with the fused segments in the
interpreter trains exactly as without it, its lookups taking the prefilled rows."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from interpreted import run_interpreted

from hetgmp.embedding.padded.prefill import prefill_redo_reference, prefill_stored_reference
from hetgmp.embedding.padded.take import take_values_reference

W, D = 2, 8


def scenario(seed: int = 0) -> dict:
    """A batch's distinct rows in 3W blocks (own | mirrors by owner | not stored, by owner),
    the stored ones' table slots, its occurrences, the replies finish writes (values for the
    rows not stored here, new table rows for mirrors refreshed beyond the bound) and the
    lookup's rows after finish (what the two passes must give)."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.tensor([30, 0, 9, 7, 6, 5])  # (own on owner 0, mirrors, not stored)
    u = int(blocks.sum())
    stored = torch.arange(u) < int(blocks[: 2 * W].sum())
    table = torch.randn(200, D, generator=g)
    slot = torch.randperm(200, generator=g)[:u]
    slot[~stored] = 0  # (unread for rows not stored here)
    src = torch.where(stored, slot, -1)
    values = torch.randn(u, D, generator=g)
    inv = torch.randint(0, u, (400,), generator=g)
    mirrors = torch.arange(int(blocks[:W].sum()), int(blocks[: 2 * W].sum()))
    fresh = mirrors[::3]  # (refreshed by finish: their table rows rewritten)
    after = table.clone()
    after[slot[fresh]] = torch.randn(len(fresh), D, generator=g)
    redo = (~stored).to(torch.int8)
    redo[fresh] = 1
    want = take_values_reference(after, src, values, inv)
    return dict(blocks=blocks, table=table, after=after, slot=slot, src=src, values=values,
                inv=inv, redo=redo, want=want)  # fmt: skip


def test_two_passes_give_the_lookups_rows() -> None:
    s = scenario()
    out = torch.full((s["inv"].numel(), D), float("nan"))
    prefill_stored_reference(s["table"], s["blocks"], s["slot"], s["inv"], out, W)
    assert torch.isnan(out).any()  # (rows not stored here: left for the second pass)
    prefill_redo_reference(s["after"], s["src"], s["redo"], s["values"], s["inv"], out)
    assert torch.equal(out, s["want"])
    stale = torch.full_like(out, float("nan"))  # (the refreshed mirrors need the second pass)
    prefill_stored_reference(s["table"], s["blocks"], s["slot"], s["inv"], stale, W)
    s["redo"][: int(s["blocks"][: 2 * W].sum())] = 0
    prefill_redo_reference(s["after"], s["src"], s["redo"], s["values"], s["inv"], stale)
    assert not torch.equal(stale, s["want"])


CASES = textwrap.dedent(
    """
    import types
    import torch
    from interpreted import mutated_module
    from test_prefill import scenario, W, D
    import hetgmp.embedding.padded.prefill_triton as pt
    from hetgmp.embedding.padded import prefill

    def check(kernels=None):
        s = scenario(1)
        n = s["inv"].numel()
        store = types.SimpleNamespace(weight_full=s["table"], device=torch.device("cpu"))
        st = types.SimpleNamespace(store=store, blocks=s["blocks"], slot=s["slot"], w=W, d=D,
                                   src=s["src"], values=s["values"], prefill_marks=s["redo"],
                                   prefill_rows=torch.full((n, D), float("nan")))
        real = prefill._kernels
        if kernels is not None:
            prefill._kernels = lambda: (real()[0], kernels)
        try:
            prefill.prefill_stored(st, s["inv"])
            store.weight_full = s["after"]
            prefill.prefill_redo(st, s["inv"])
        finally:
            prefill._kernels = real
        return torch.equal(st.prefill_rows, s["want"])

    print("real", check())
    print("block", check(mutated_module(pt, "stored = rmask & (seg < 2 * W)",
                                        "stored = rmask & (seg < W)")))
    print("redo", check(mutated_module(pt, "r = rmask & (tl.load(", "r = rmask & ~(tl.load(")))
    """
)


def test_kernels_match_the_references_in_interpreter(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    out = run_interpreted(tmp_path / "prefill_checks.py", CASES)
    assert out == ["real", "True", "block", "False", "redo", "False"]


def _interpreted_prefill(env, cfg) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """The whole-step flow with the fused segments in Triton's interpreter over peer payloads,
    without and with the prefill; and how many lookups took prefilled rows."""
    from test_whole_step_multi import _rank, interpreter_now

    interpreter_now()
    from gpu_prefill_check import prefilled_lookups

    from hetgmp.embedding.padded import peer_payloads

    peer_payloads.PEER_PAYLOADS = peer_payloads.ON_CPU = True
    off = _rank(env, cfg, True, None)
    with prefilled_lookups() as taken:
        on = _rank(env, cfg, True, None)
    on["prefilled"] = taken[0]
    return off, on


# (slow: ~40 s in the interpreter; the kernels' equality above runs in the fast suite)
@pytest.mark.slow
def test_prefilled_lookups_train_as_the_gathered_ones_in_interpreter(
    tiny_dataset, tmp_path
) -> None:
    pytest.importorskip("triton")
    from test_whole_step_multi import _assert_runs_equal, interpreted_runs

    runs = interpreted_runs(tiny_dataset, tmp_path, _interpreted_prefill, iter=6)
    _assert_runs_equal([r[0] for r in runs], [r[1] for r in runs])
    assert all(r[1]["prefilled"] >= 3 for r in runs), [r[1]["prefilled"] for r in runs]
