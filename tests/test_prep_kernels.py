"""The batch plan's fused Triton kernels (hetgmp/embedding/kernels/prep.py) against its torch
reference (``BatchPlanner.prepare_reference``), element for element, and the reference against
a plain-Python oracle of the plan (first occurrence leads, stable block order, padding last).

On CPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, which must be set
before triton is imported: a subprocess). The GPU run of the same comparison at full size is
``bench/gpu/prep_kernels.py``."""

from __future__ import annotations

import textwrap

import pytest
import torch
from interpreted import run_interpreted

from hetgmp.embedding.batch import BatchPlanner

pytest.importorskip("triton")

FIELDS = ("bad", "u", "cnt", "slot", "inv", "blocks")

SCRIPT = textwrap.dedent(
    """
    import torch
    from hetgmp.embedding.batch import BatchPlanner
    from hetgmp.embedding.kernels import prep

    FIELDS = ("bad", "u", "cnt", "slot", "inv", "blocks")

    def planners(rows, world, g, used_keys=None):
        keys = torch.arange(3 * world) if used_keys is None else torch.tensor(used_keys)
        block_of = keys[torch.randint(0, len(keys), (rows,), generator=g)].int()
        slot_of = torch.randint(-1, rows, (rows,), generator=g, dtype=torch.int32)
        cpu = torch.device("cpu")
        return [BatchPlanner(slot_of, block_of, world, cpu, backend=b) for b in ("torch", "triton")]

    def compare(ref, tri, ids, what):
        a, b = ref.prepare(ids), tri.prepare(ids)
        for f in FIELDS:
            x, y = getattr(a, f), getattr(b, f)
            assert x.dtype == y.dtype and x.shape == y.shape, (what, f, x.dtype, y.dtype)
            assert torch.equal(x, y), (what, f, x, y)
        assert bool((tri.min_map == 2**31 - 1).all()), what  # the map's state between calls
        for p in (ref, tri):  # written into given arrays (a ring slot's): every element
            n, k = ids.numel(), 3 * p.world
            out = prep.PlanArrays(
                bad=torch.ones((), dtype=torch.bool), u=torch.full((n,), -7),
                cnt=torch.full((n,), -7), slot=torch.full((n,), -7),
                inv=torch.full((n,), -7, dtype=torch.int32), blocks=torch.full((k,), -7))
            c = p.prepare(ids, out)
            for f in FIELDS:
                assert getattr(c, f) is getattr(out, f), (what, f)
                assert torch.equal(getattr(c, f), getattr(a, f)), (what, "into", f)
        return a

    def main():
        g = torch.Generator().manual_seed(3)
        seen_bad = 0
        # the in-program aggregation (prep.AGGREGATE: sorts, ~60 ms a program in the
        # interpreter) on hot rows, ids out of range, several programs of 32 (2 and 3, the
        # last one partial); then the plain atomics
        prep.AGGREGATE, prep.BLOCK = True, 32
        ref, tri = planners(97, 3, g)
        for b, f in ((0, 1), (1, 1), (9, 5), (41, 2)):
            ids = (torch.rand(b, f, generator=g) ** 4 * 97).long()
            if b > 40:
                ids[5, 0], ids[-1, -1] = -3, 99
            assert bool(compare(ref, tri, ids, ("agg", b, f)).bad) == (b > 40)
        # rows whose low 21 bits collide (prep_mark sorts by a 21-bit hash): interleaved
        # runs of different rows in one program, the first occurrence must still lead
        big = 3 * 2**21 + 7
        ref, tri = planners(big, 2, g)
        hot = torch.tensor([5, 5 + 2**21, 5 + 2 * 2**21, 9, 9 + 2**22])
        ids = hot[torch.randint(0, 5, (20, 3), generator=g)]  # (2 programs)
        compare(ref, tri, ids, "hash collisions")
        # leaders marked by field (prep.MARK_BY_FIELD): programs of 8 samples of one field,
        # the last one partial; hot rows, ids out of range, hash-colliding rows; every array
        # made by torch.empty filled with junk first (the kernels' scratch: the counts per
        # occurrence are written for leaders only, so an entry read unwritten shows here)
        empty = torch.empty
        torch.empty = lambda *a, **k: empty(*a, **k).fill_(77)
        prep.MARK_BY_FIELD, prep.MARK_SAMPLES = True, 8
        ref, tri = planners(97, 2, g)
        for b, f in ((1, 1), (12, 3), (19, 2)):  # (2 and 3 programs a field)
            ids = (torch.rand(b, f, generator=g) ** 4 * 97).long()
            if b > 15:
                ids[5, 0], ids[-1, -1] = -3, 99
            assert bool(compare(ref, tri, ids, ("field", b, f)).bad) == (b > 15)
        ref, tri = planners(big, 2, g)
        compare(ref, tri, hot[torch.randint(0, 5, (20, 3), generator=g)], "field collisions")
        assert tri.cnt_map is not None and not tri.cnt_map.any()  # (zero between calls)
        prep.MARK_BY_FIELD, torch.empty = False, empty
        prep.AGGREGATE, prep.BLOCK = False, 1024
        for world in (1, 2, 3, 4):
            ref, tri = planners(97, world, g)
            for b, f in ((0, 1), (1, 1), (700, 1), (37, 26), (64, 32), (50, 41)):
                ids = (torch.rand(b, f, generator=g) ** 4 * 97).long()  # hot rows repeat
                if b > 40 and world % 2:  # out of range on both sides: flagged, clamped
                    ids[5, 0], ids[-1, -1] = -3, 97 + world
                seen_bad += bool(compare(ref, tri, ids, (world, b, f)).bad)
        assert seen_bad == 6, seen_bad
        assert prep.trial(torch.device("cpu"))  # (resolve("auto")'s check: a plan by hand)
        # Empty blocks: only some keys used; several programs and scan steps (small tiles: 16
        # keys padded, 4 programs' histograms a scan step): one program, 7 (the last step
        # partial), 8 (two whole steps)
        prep.BLOCK, prep.SCAN_TILE = 16, 64
        ref, tri = planners(300, 4, g, used_keys=[1, 5, 11])
        for n in (16, 99, 128):
            p = compare(ref, tri, (torch.rand(n, 1, generator=g) ** 2 * 300).long(), n)
            assert int(p.blocks[0]) == 0 and int(p.blocks[1]) > 0
        print("ok")

    main()
    """
)


def test_fused_prep_matches_reference_in_interpreter(tmp_path) -> None:
    """World sizes 1..4, hot rows, ids out of range, one-field batches, empty batches, empty
    blocks, sizes off the tile size, several programs and scan steps."""
    assert run_interpreted(tmp_path / "prep_check.py", SCRIPT) == ["ok"]


def _oracle(ids: list[int], block_of: list[int], slot_of: list[int], w: int) -> dict:
    """The plan in plain Python: a row's first occurrence leads; leaders stably by block key,
    then the other occurrences in position order (count 0)."""
    rows = [min(max(i, 0), len(block_of) - 1) for i in ids]
    first: dict[int, int] = {}
    for p, r in enumerate(rows):
        first.setdefault(r, p)
    key = [block_of[r] if first[r] == p else 3 * w for p, r in enumerate(rows)]
    order = sorted(range(len(rows)), key=lambda p: key[p])
    pos = {p: j for j, p in enumerate(order)}
    return {
        "bad": any(r != i for r, i in zip(rows, ids, strict=True)),
        "u": [rows[p] for p in order],
        "cnt": [rows.count(rows[p]) if key[p] < 3 * w else 0 for p in order],
        "slot": [slot_of[rows[p]] for p in order],
        "inv": [pos[first[r]] for r in rows],
        "blocks": [key.count(k) for k in range(3 * w)],
    }


def test_reference_plan_matches_python_oracle() -> None:
    """The torch reference is what its docstring says, leaders being first occurrences."""
    g = torch.Generator().manual_seed(5)
    for w in (1, 2, 3):
        block_of = torch.randint(0, 3 * w, (30,), generator=g, dtype=torch.int32)
        slot_of = torch.randint(-1, 30, (30,), generator=g, dtype=torch.int32)
        planner = BatchPlanner(slot_of, block_of, w, torch.device("cpu"))
        ids = (torch.rand(25, 3, generator=g) ** 3 * 33).long() - 1  # -1 and 30..32: bad
        got = planner.prepare(ids)
        want = _oracle(ids.flatten().tolist(), block_of.tolist(), slot_of.tolist(), w)
        for f in FIELDS:
            t = getattr(got, f)
            assert (t.tolist() if t.dim() else bool(t)) == want[f], (w, f)


def test_plan_into_arrays_of_the_wrong_shape_is_refused() -> None:
    """``prepare_triton(out=...)`` checks the arrays before any kernel runs."""
    from hetgmp.embedding.kernels.prep import PlanArrays, new_min_map, prepare_triton

    i32 = torch.zeros(10, dtype=torch.int32)
    out = PlanArrays(bad=torch.zeros((), dtype=torch.bool), u=torch.zeros(6, dtype=torch.int64),
                     cnt=torch.zeros(6, dtype=torch.int64), slot=torch.zeros(6, dtype=torch.int64),
                     inv=torch.zeros(5, dtype=torch.int64), blocks=torch.zeros(6, dtype=torch.int64))  # fmt: skip
    with pytest.raises(ValueError, match="plan output inv"):
        prepare_triton(torch.zeros(2, 3, dtype=torch.int64), i32, i32, new_min_map(10, torch.device("cpu")), 2, out=out)  # fmt: skip
