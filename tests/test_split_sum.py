"""The rows' gradient sum split in two passes over the same occurrences (``scatter_add_rows(...,
part=(bound, 1 | 2))``: the rows below a bound read on the device, then those at or above it;
``owner_update.SPLIT_SUM``, off until measured, issue 30): each pass adds exactly its rows'
occurrences, and the two passes add what the one sum adds, with the per-field kernel, the
plain kernel (Triton's interpreter) and the torch reference."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from interpreted import run_interpreted

from hetgmp.embedding.kernels import scatter_add_rows

CASES = textwrap.dedent(
    """
    import torch
    from hetgmp.embedding.kernels import rows as R
    from hetgmp.embedding.kernels import scatter_add_rows, scatter_add_rows_reference

    def check(device):
        g = torch.Generator().manual_seed(1)
        R.FIELD_RUNS_INTERPRETED = True
        for fields in (4, None):  # (the per-field kernel, then the plain one)
            b, f, d, rows = 70, 3, 8, 30
            idx = (torch.rand(b, f, generator=g) ** 3 * rows).long()
            idx[torch.rand(b, f, generator=g) < 0.1] = -1  # padding: skipped by both passes
            src = torch.randn(b, f, d, generator=g)
            bound = torch.tensor([13])
            flat, keep = idx.reshape(-1), idx.reshape(-1) >= 0
            for which, sel in ((1, keep & (flat < 13)), (2, flat >= 13)):
                want = scatter_add_rows_reference(
                    torch.zeros(rows, d), flat[sel], src.reshape(-1, d)[sel], 0.5)
                got = scatter_add_rows(torch.zeros(rows, d).to(device), idx.to(device),
                                       src.to(device), 0.5, backend="triton", fields=fields,
                                       part=(bound.to(device), which))
                torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
                # (the other pass's rows untouched)
                other = torch.arange(rows) >= 13 if which == 1 else torch.arange(rows) < 13
                assert got.cpu()[other].abs().sum() == 0
            both = torch.zeros(rows, d).to(device)
            for which in (2, 1):
                scatter_add_rows(both, idx.to(device), src.to(device), 0.5, backend="triton",
                                 fields=fields, part=(bound.to(device), which))
            whole = scatter_add_rows(torch.zeros(rows, d).to(device), idx.to(device),
                                     src.to(device), 0.5, backend="triton", fields=fields)
            assert torch.equal(both, whole)  # (each row's adds are the one sum's)
        print("ok")
    """
)


def test_two_passes_add_the_one_sum_in_interpreter(tmp_path) -> None:
    pytest.importorskip("triton")
    assert run_interpreted(tmp_path / "split_checks.py", CASES, calls=("check('cpu')",)) == ["ok"]


def test_reference_parts_add_the_whole_sum_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(2)
    idx = (torch.rand(60, 3, generator=g) ** 2 * 20).long()
    src = torch.randn(60, 3, 8, generator=g)
    bound = torch.tensor([7])
    both = torch.zeros(20, 8)
    for which in (2, 1):
        scatter_add_rows(both, idx, src, 1.0, part=(bound, which))
    whole = scatter_add_rows(torch.zeros(20, 8), idx, src, 1.0)
    assert torch.equal(both, whole) and whole[:7].abs().sum() > 0 and whole[7:].abs().sum() > 0
    own = scatter_add_rows(torch.zeros(20, 8), idx, src, 1.0, part=(bound, 1))
    assert own[7:].abs().sum() == 0 and torch.equal(own[:7], whole[:7])


def _interpreted(env, cfg) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    from test_push_slots_early import _with_versions
    from test_whole_step_multi import interpreter_now

    interpreter_now()
    from hetgmp.embedding.padded import owner_update

    counts = {"held": 0, "run": 0, "staged": 0}
    hold, take = owner_update.hold_own_sum, owner_update.take_own_sum

    def held(st, run) -> None:  # type: ignore[no-untyped-def]
        counts["held"] += 1
        hold(st, run)

    def taken(st):  # type: ignore[no-untyped-def]
        run = take(st)
        counts["run"] += run is not None
        # (taken by the pre-sync, whose own rows' staging then runs it: the split's point)
        counts["staged"] += run is not None and sys._getframe(1).f_code.co_name == "presync_values"
        if run is not None:
            counts.setdefault("callers", []).append(sys._getframe(1).f_code.co_name)
        return run

    owner_update.hold_own_sum, owner_update.take_own_sum = held, taken  # type: ignore[assignment]
    off = _with_versions(env, cfg)
    owner_update.SPLIT_SUM = True
    on = _with_versions(env, cfg)
    on.update(counts)
    return off, on


# (slow: ~40 s in Triton's interpreter for a switch off until measured; run with -m slow
# before turning it on)
@pytest.mark.slow
def test_split_sum_trains_as_the_one_sum(tiny_dataset, tmp_path) -> None:
    """The whole-step flow with the own rows' pass of the sum run by their staging (peer
    payloads, the fused segments in Triton's interpreter, Adagrad: the split update on) trains
    exactly as with one sum: rows, state, dense layers, counters and versions."""
    pytest.importorskip("triton")
    from test_whole_step_multi import _assert_runs_equal, interpreted_runs

    runs = interpreted_runs(tiny_dataset, tmp_path, _interpreted, iter=24)
    _assert_runs_equal([r[0] for r in runs], [r[1] for r in runs])
    for off, on in runs:
        assert torch.equal(off["versions"], on["versions"])
        assert on["held"] >= 4 and on["run"] == on["held"], (on["held"], on["run"])
        assert on["staged"] >= on["held"] - 2, (on["staged"], on["held"], on.get("callers"))
