"""The device tier's lookup in Triton kernels (:func:`hetgmp.embedding.tier_misses.
miss_slots_fused`, :mod:`hetgmp.embedding.tier_triton`) against a plain-Python account, in
Triton's interpreter: cached rows keep their slots, every distinct missed row gets one dense
entry listing it, bad ids get the refused slot and are neither counted nor listed, ``seen``
counts every valid occurrence, ``hits`` the distinct cached rows; the scratch map needs no
reset. Mutants (entries numbered without the exclusive prefix; every occurrence of a row
leading) fail the same account."""

from __future__ import annotations

import textwrap
from pathlib import Path

from interpreted import run_interpreted

CASES = textwrap.dedent(
    """
    import sys
    import torch
    from interpreted import mutated_module
    import hetgmp.embedding.tier_triton as tt
    from hetgmp.embedding.tier_misses import miss_slots_fused

    def account(ids, slot_of, c, m, pos, seen, hits, rows):
        n_rows = slot_of.numel()
        before = seen.clone()
        plan = miss_slots_fused(ids, slot_of, pos, c, m, seen=seen, hits=hits, rows=rows)
        flat, slots = ids.tolist(), plan.slots.tolist()
        good = [r for r in flat if 0 <= r < n_rows]
        missed = sorted({r for r in good if int(slot_of[r]) < 0})
        cached = {r for r in good if int(slot_of[r]) >= 0}
        ok = int(plan.misses) == len(missed) and int(hits) == len(cached)
        entry_of = {}
        for r, s in zip(flat, slots):
            if not 0 <= r < n_rows:
                ok &= s == c + m  # refused
            elif int(slot_of[r]) >= 0:
                ok &= s == int(slot_of[r])
            else:
                ok &= c <= s < c + len(missed) and entry_of.setdefault(r, s - c) == s - c
        got = plan.rows.tolist()
        ok &= sorted(entry_of.values()) == list(range(len(missed)))
        ok &= all(got[e] == r for r, e in entry_of.items())
        ok &= got[len(missed):] == [-1] * (m - len(missed))
        want = before + torch.bincount(torch.tensor(good, dtype=torch.int64), minlength=n_rows)
        return ok and torch.equal(seen, want.to(torch.int32))

    def check():
        g = torch.Generator().manual_seed(0)
        n_rows, c = 3000, 200
        slot_of = torch.full((n_rows,), -1, dtype=torch.int32)
        slot_of[torch.randperm(n_rows, generator=g)[:c]] = torch.arange(c, dtype=torch.int32)
        pos = torch.full((n_rows + 1,), 7, dtype=torch.int32)  # (any contents)
        seen = torch.zeros(n_rows, dtype=torch.int32)
        ok = True
        for n in (5000, 1, 2500, 1024):
            ids = (torch.rand(n, generator=g) ** 3 * n_rows).long()  # hot rows repeat
            ids[:: 97] = n_rows + 5
            ids[3 :: 211] = -4
            hits = torch.zeros(1, dtype=torch.int64)
            rows = torch.zeros(5000, dtype=torch.int64)
            ok &= account(ids, slot_of, c, 5000, pos, seen, hits, rows)
        return ok

    def mutant(old, new):
        sys.modules["hetgmp.embedding.tier_triton"] = mutated_module(tt, old, new)
        try:
            return check()
        finally:
            sys.modules["hetgmp.embedding.tier_triton"] = tt

    print("real", check())
    print("inclusive", mutant("(tl.cumsum(k, 0) - k)", "tl.cumsum(k, 0)"))
    print("all_lead", mutant("lead = ok & (tl.load(pos_ptr + row, mask=ok, other=-1) == i)",
                             "lead = ok"))
    """
)


def test_fused_lookup_matches_a_plain_account(tmp_path: Path) -> None:
    out = run_interpreted(tmp_path / "tier_triton_checks.py", CASES)
    assert out == ["real", "True", "inclusive", "False", "all_lead", "False"]
