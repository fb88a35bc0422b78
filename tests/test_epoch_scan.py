"""The epoch-start scan's kernels (:mod:`hetgmp.embedding.padded.epoch_scan`, no sort) count
what its torch reference (``torch.unique`` over the epoch's ``(batch, row)`` keys) counts, per
batch: queries per peer, distinct rows, rows not stored per peer, rows held more than --bound
times; in Triton's interpreter, over epochs in a row (the rows' stamps and counts kept)."""

from __future__ import annotations

import textwrap

import pytest
from interpreted import run_interpreted

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    from types import SimpleNamespace

    import torch

    from hetgmp.embedding.padded import epoch_scan

    def store(rows, world, g):
        # block_of: own rows (key 0 = this rank), mirrors w + owner, not stored 2w + owner
        keys = torch.arange(3 * world)
        keys = keys[keys != 0 + 0 * world]
        block = keys[torch.randint(0, len(keys), (rows,), generator=g)]
        block[: rows // 3] = 0
        return SimpleNamespace(num_rows=rows, world=world, device=torch.device("cpu"),
                               block_of=block.int())

    def main():
        g = torch.Generator().manual_seed(5)
        epoch_scan.BLOCK = 32  # (several programs a batch)
        for world, bound in ((2, 0), (2, 3), (3, 1)):
            st = store(61, world, g)
            scan = epoch_scan.EpochScan(st)
            sparse = (torch.rand(50, 4, generator=g) ** 3 * 61).long()  # hot rows repeat
            sparse[7, 2], sparse[9, 0] = -4, 70  # (out of range: clamped, as the steps do)
            for epoch in range(3):  # (stamps and counts carry over)
                pos = torch.randperm(50, generator=g)[: 45 - 2 * epoch]  # (a partial batch)
                ref = epoch_scan.epoch_maxima_reference(st, bound, sparse, pos, 8)
                got = scan.maxima(bound, sparse, pos, 8)
                assert torch.equal(ref, got), (world, bound, epoch, ref, got)
                if bound:  # (cleared between batches; none made at bound 0)
                    assert int(scan._occ.abs().sum()) == 0
                else:
                    assert scan._occ is None
            assert int(ref[:, 3].max()) > 0, "no hot rows: the check would prove nothing"
        empty = epoch_scan.EpochScan(store(5, 2, g)).maxima(1, sparse, pos[:0], 8)
        assert empty.shape == (0, 4)
        print("ok")

    main()
    """
)


def test_kernels_count_as_the_reference_in_interpreter(tmp_path) -> None:
    assert run_interpreted(tmp_path / "epoch_scan_check.py", SCRIPT) == ["ok"]
