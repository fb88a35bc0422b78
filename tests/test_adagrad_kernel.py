"""The row-wise Adagrad kernel (hetgmp/embedding/kernels/adagrad.py) against its torch
reference, in Triton's interpreter (``TRITON_INTERPRET=1`` must be set before triton is
imported: a subprocess): every entry, a kept subset, the leader occurrences of repeated rows, the entries a mark and a
slot skip (each consuming its gradient rows);
dims below, at and above the 128-column tile."""

from __future__ import annotations

import textwrap

import pytest
from interpreted import run_interpreted

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import torch
    from hetgmp.embedding.kernels.adagrad import adagrad_rows, adagrad_rows_reference

    g = torch.Generator().manual_seed(0)
    for rows, n, d in ((50, 40, 16), (300, 257, 20), (90, 64, 200), (5, 0, 8)):
        w0 = torch.randn(rows, d, generator=g)
        s0 = torch.rand(rows, generator=g)
        grad = torch.randn(n, d, generator=g)
        uniq = torch.randperm(rows, generator=g)[:n]  # distinct rows
        hot = (torch.rand(n, generator=g) ** 3 * rows).long()  # repeated rows
        pos = torch.empty(rows, dtype=torch.int32)
        pos[hot] = torch.arange(n, dtype=torch.int32)
        lead = pos[hot]  # one leader occurrence per row
        keep = torch.rand(n, generator=g) < 0.5
        marks = (torch.rand(n, generator=g) < 0.3).long()  # (e.g. own rows a push joins)
        slot = int(uniq[n // 2]) if n else -1  # (e.g. the trash slot of padding entries)
        skipped = {"keep": (marks == 0) & (uniq != slot)}  # (what skip selects)
        cases = [(uniq, {}, {}), (uniq, {"keep": keep}, {"keep": keep}),
                 (hot, {"lead": lead}, {"lead": lead}), (uniq, {"skip": (marks, slot)}, skipped)]
        for idx, sel, ref in cases:
            want_w, want_s = w0.clone(), s0.clone()
            adagrad_rows_reference(want_w, want_s, idx, grad, 0.1, 1e-8, **ref)
            got_w, got_s, used = w0.clone(), s0.clone(), grad.clone()
            adagrad_rows(got_w, got_s, idx, used, 0.1, 1e-8, backend="triton", consume=True, **sel)
            torch.testing.assert_close(got_s, want_s, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got_w, want_w, rtol=1e-5, atol=1e-6)
            changed = (got_w != w0).any(dim=1).sum().item()
            assert changed == (want_w != w0).any(dim=1).sum().item()
            # (consume: the selected entries' gradient rows zeroed, the others untouched)
            zeroed = (used == 0).all(dim=1) & (grad != 0).any(dim=1)
            assert zeroed.sum().item() == changed, (zeroed.sum().item(), changed)
            if "skip" in sel:  # (and the torch backend's skip: the same selection)
                tw, ts = w0.clone(), s0.clone()
                adagrad_rows(tw, ts, idx, grad.clone(), 0.1, 1e-8, backend="torch", **sel)
                torch.testing.assert_close(tw, want_w, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(ts, want_s, rtol=1e-5, atol=1e-6)
    print("ok")
    """
)


def test_adagrad_kernel_matches_reference_in_interpreter(tmp_path) -> None:
    assert run_interpreted(tmp_path / "adagrad_check.py", SCRIPT) == ["ok"]
