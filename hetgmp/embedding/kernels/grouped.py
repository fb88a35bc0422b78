"""``scatter_add_grouped``: the row update of a ``[B, F]`` batch that sums repeats first.

``table[idx[b, f]] += alpha * src[b, f]`` for every entry, like :func:`.rows.scatter_add_rows`
over the flattened batch (its torch reference is the reference here too). Why a second kernel:
the one-rank step adds a whole batch's gradient with one float atomic per element, and a CTR
batch repeats the rows of its small fields thousands of times (a field of 4 values: about 2048
occurrences of each row per 8192 samples), so a flat scatter spends most of its time on atomics
that all hit the same few rows (0.10 ms of a 0.66 ms WDL step at batch 8192 on an H100). Here a
program takes one field's column of ``BLOCK_B`` samples, sums the entries that share an index in
registers and adds each such group with one row of atomics; singletons add as before. The sums'
order differs from the flat kernel's (both are non-deterministic), so tests use a tolerance.
"""

from __future__ import annotations

import torch

from hetgmp.embedding.kernels.launcher import _kernels, launch, on_device
from hetgmp.embedding.kernels.rows import scatter_add_rows_reference

BLOCK_B = 64  # samples per program: the pairwise repeat count is BLOCK_B^2 compares
MAX_GROUPS = 16  # repeated indices summed per program (the most repeated first)


def scatter_add_grouped(
    table: torch.Tensor,
    idx: torch.Tensor,
    src: torch.Tensor,
    alpha: float = 1.0,
    *,
    backend: str = "torch",
) -> torch.Tensor:
    """``table[idx[b, f]] += alpha * src[b, f]`` (``table [R, D]`` float32 contiguous, ``idx
    [B, F]`` int32/int64 in range or negative to skip on the Triton path, ``src [B, F, D]``
    float32 / bf16 / fp16)."""
    if idx.dim() != 2 or src.dim() != 3 or src.shape[:2] != idx.shape:
        raise ValueError(f"scatter_add_grouped: idx {tuple(idx.shape)} vs src {tuple(src.shape)}")
    d = src.shape[-1]
    if table.dim() != 2 or table.shape[1] != d or table.dtype != torch.float32:
        raise ValueError(f"scatter_add_grouped: table {tuple(table.shape)} {table.dtype}, D {d}")
    if backend == "torch" or idx.numel() == 0:
        return scatter_add_rows_reference(table, idx.reshape(-1), src.reshape(-1, d), alpha)
    if not table.is_contiguous():
        raise ValueError("scatter_add_grouped needs a contiguous table")
    k = _kernels()
    b, f = idx.shape
    block_d = min(k.triton.next_power_of_2(d), 64)
    grid = (f, k.triton.cdiv(b, BLOCK_B), k.triton.cdiv(d, block_d))
    consts = {"D": d, "BLOCK_B": BLOCK_B, "BLOCK_D": block_d, "MAX_GROUPS": MAX_GROUPS}
    with on_device(table):
        launch(
            k.scatter_grouped, grid,
            (table, idx.contiguous(), src.contiguous(), b, f, float(alpha)), consts,
        )  # fmt: skip
    return table
