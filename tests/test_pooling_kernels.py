"""The fused pooled lookup's Triton kernels (hetgmp/models/pooling_fused.py, issue 34) against
the torch reference (``BagLayout``'s plain path: ``PoolBags`` + ``cat``) and against
``F.embedding_bag``: forward and backward, sum and mean, empty bags, repeated ids, padding,
fp32 and bf16 rows, several programs and column tiles; ``--kernels`` resolved for pooling.

On CPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is
imported: a subprocess). The GPU run of the same lookup in training is
``tests/gpu_multi_hot_check.py``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from interpreted import run_interpreted

from hetgmp.models.pooling import BagLayout
from hetgmp.models.pooling_fused import pool_fields_reference, resolve_pooling, segment_offsets

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn
    from hetgmp.data.multi_hot_padded import PAD_ID
    from hetgmp.models import pooling_fused
    from hetgmp.models.pooling import BagLayout

    def batch(g, b, f, widths, rows):
        single = torch.randint(0, rows, (b, f), generator=g)
        cols = []
        for w in widths:
            lengths = torch.randint(0, w + 1, (b,), generator=g)
            lengths[: min(b, 2)] = torch.tensor([0, w])[: min(b, 2)]  # an empty and a full bag
            # few distinct ids: repeats within a bag and across bags
            bag = torch.randint(0, max(2, rows // 8), (b, w), generator=g)
            bag[torch.arange(w)[None, :] >= lengths[:, None]] = PAD_ID
            cols.append(bag)
        return torch.cat([single, *cols], dim=1)

    def run(layout, table, ids, grad):
        table.weight.grad = None
        out = layout.lookup(table, ids)
        out.backward(grad)
        return out.detach(), table.weight.grad.clone()

    def bag_oracle(table, ids, f, widths, pooling):
        # F.embedding_bag over every field (padding: an extra zero row, excluded)
        w = torch.cat([table.weight.detach().float(), torch.zeros(1, table.weight.shape[1])])
        pad = w.shape[0] - 1
        out = [w[ids[:, :f]]]
        col = f
        for width, mode in zip(widths, pooling):
            bag = ids[:, col : col + width]
            bag = torch.where(bag == PAD_ID, pad, bag)
            out.append(F.embedding_bag(bag, w, mode=mode, padding_idx=pad)[:, None])
            col += width
        return torch.cat(out, dim=1)

    def main():
        g = torch.Generator().manual_seed(7)
        cases = 0
        for dtype in (torch.float32, torch.bfloat16):
            for b, f, widths, d, pooling in (
                (37, 3, (5, 2), 16, ("sum", "mean")),
                (70, 2, (9,), 200, ("mean",)),  # several programs, two column tiles
                (5, 0, (3, 4), 8, ("sum", "sum")),  # no single-hot field
                (1, 4, (1, 6, 2), 24, ("mean", "mean", "sum")),
            ):
                rows = 50
                table = nn.Embedding(rows, d).to(dtype)
                with torch.no_grad():
                    table.weight.normal_(generator=g)
                ids = batch(g, b, f, widths, rows)
                grad = torch.randn(b, f + len(widths), d, generator=g).to(dtype)
                ref = BagLayout(f, widths, pooling)
                tri = BagLayout(f, widths, pooling, backend="triton")
                want, want_g = run(ref, table, ids, grad)
                got, got_g = run(tri, table, ids, grad)
                assert got.dtype == want.dtype == dtype, (got.dtype, want.dtype)
                tol = dict(rtol=0, atol=0) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
                # (fp32: the same sums in the same order; the kernel adds in the lookup order)
                if dtype == torch.float32:
                    tol = dict(rtol=1e-6, atol=1e-6)
                torch.testing.assert_close(got, want, **tol)
                if dtype == torch.bfloat16:  # (the table sums bf16 occurrence gradients)
                    tol["atol"] = 1e-2 * float(want_g.float().abs().max())
                torch.testing.assert_close(got_g, want_g, **tol)
                oracle = bag_oracle(table, ids, f, widths, pooling)
                torch.testing.assert_close(got.float(), oracle, rtol=1e-2, atol=1e-2)
                cases += 1
        # an empty batch (a rank out of samples): no launch, a [0, F + K, D] input
        table = nn.Embedding(10, 4)
        out = BagLayout(2, (3,), ("sum",), backend="triton").lookup(table, torch.zeros(0, 2).long())
        assert out.shape == (0, 3, 4), out.shape
        # only padding: every bag pools to zeros (sum and mean), no gradient reaches the table
        ids = torch.tensor([[1, PAD_ID, PAD_ID], [2, PAD_ID, PAD_ID]])
        for mode in ("sum", "mean"):
            layout = BagLayout(1, (2,), (mode,), backend="triton")
            table.weight.grad = None
            out = layout.lookup(table, ids)
            assert bool((out[:, 1] == 0).all())
            out.sum().backward()
            assert table.weight.grad[3:].abs().sum() == 0 and table.weight.grad[1:3].abs().sum() > 0
        assert pooling_fused._trial(torch.device("cpu")) is None
        assert pooling_fused.resolve_pooling("triton", torch.device("cpu")) == "triton"
        print("ok", cases)

    main()
    """
)


def test_fused_pooling_matches_reference_in_interpreter(tmp_path: Path) -> None:
    assert run_interpreted(tmp_path / "pool_check.py", SCRIPT) == ["ok", "8"]


def test_segment_offsets_and_reference() -> None:
    """The offsets of each (sample, field) bag among the lookup's bag values, and the fused
    reference against the plain path."""
    present = torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 1]]) > 0
    off = segment_offsets(present, torch.tensor([1, 3]))
    assert off.tolist() == [0, 1, 3, 3, 3, 5, 6]
    ids = torch.tensor([[4, 1, -1, 2, 2], [5, -1, -1, -1, -1], [6, 3, 0, -1, 1]])
    table = torch.nn.Embedding(8, 3)
    for pooling in (("sum", "mean"), ("mean", "sum")):
        want = BagLayout(1, (2, 2), pooling).lookup(table, ids)
        rows = table(torch.cat([ids[:, 0], ids[:, 1:][present]]))
        mean = torch.tensor([p == "mean" for p in pooling])
        got = pool_fields_reference(rows, off, mean, 3, 1)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_resolve_pooling() -> None:
    cpu = torch.device("cpu")
    assert resolve_pooling("auto", cpu) == "torch"
    assert resolve_pooling("torch", cpu) == "torch"
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        resolve_pooling("triton", cpu)
    with pytest.raises(ValueError, match="kernels must be one of"):
        resolve_pooling("fast", cpu)
    with pytest.raises(ValueError, match="pooling backend"):
        BagLayout(1, (2,), ("sum",), backend="cuda")
