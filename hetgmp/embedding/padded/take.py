"""A padded step's lookup of its occurrences' rows (``values[inv]``), with the rows stored here
read straight from the table (:data:`TAKE_FROM_TABLE`, on: measured on 2 GPUs).

Why: ``finish_values`` wrote every distinct row of the batch into ``values`` (the stored ones
copied from the table), and the lookup then gathered ``values[inv]``: the stored rows crossed
memory twice. With the switch, ``finish_values`` writes only the rows not stored here (from the
reply) and each stored row's slot into ``src`` (``-1`` for the others), and the lookup reads
``weight_full[src[i]]`` or ``values[i]`` per occurrence: one pass (2 H100s, batch 8192: finish
24 us + take 28 us against one GPU's take_local 33, ``bench/results/gpu/scaling_diagnosis/
timeline_8192/``). Nothing writes the table between ``finish_values`` and the lookup (the
owner's update and the mirrors' local step run before the answer), and with reading ahead the
table's row is what ``refresh_stored`` would read again.

:func:`take_values_reference` is what the kernel must equal; ``tests/test_padded_take.py``.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch

from hetgmp.embedding.kernels import take_rows
from hetgmp.embedding.kernels.launcher import launch, on_device, row_tiles

# On since 2026-11-27: 2x H200, the user's command at batch 8192, 1.60x -> 1.62x alone and
# 1.65x -> 1.67x with the peer payloads (bench/results/gpu/peer_direct/); exact (the tests).
TAKE_FROM_TABLE = True


def take_values_reference(
    table: torch.Tensor, src: torch.Tensor, values: torch.Tensor, inv: torch.Tensor
) -> torch.Tensor:
    """Row ``table[src[inv[o]]]`` where that slot is ``>= 0``, else ``values[inv[o]]``."""
    s = src.index_select(0, inv)
    stored = table.index_select(0, s.clamp(min=0))
    return torch.where((s >= 0)[:, None], stored, values.index_select(0, inv))


def take_values(
    st: Any, values: torch.Tensor, inv: torch.Tensor, *, backend: str,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # fmt: skip
    """The rows of the batch's occurrences ``inv`` (``[n]`` positions into its distinct rows)
    after the padded exchange ``st`` (a :class:`~.buffers.StaticExchange`) finished: from
    ``values`` alone, or with ``st.from_table`` from the table for the rows stored here;
    ``out_dtype``: the rows' dtype (e.g. the autocast one), converted in the kernel."""
    if not st.from_table:
        return take_rows(values, inv, backend=backend, out_dtype=out_dtype)
    table, src = st.store.weight_full, st.src
    dtype = out_dtype or values.dtype
    if backend != "triton":
        return take_values_reference(table, src, values, inv).to(dtype)
    n, d = inv.numel(), table.shape[1]
    out = torch.empty(n, d, dtype=dtype, device=values.device)
    triton, kernel = _kernel()
    block_r, block_d = row_tiles(triton, d)
    with on_device(table):
        launch(
            kernel, (max(1, triton.cdiv(n, block_r)),), (table, src, values, inv, out, n),
            {"D": d, "BLOCK_R": block_r, "BLOCK_D": block_d},
        )  # fmt: skip
    return out


@functools.lru_cache(maxsize=1)
def _kernel() -> tuple[Any, Any]:
    """``(triton, take_values_kernel)``, imported once (Triton only where it runs)."""
    kt = importlib.import_module("hetgmp.embedding.padded.kernels_triton")
    return importlib.import_module("triton"), kt.take_values_kernel
