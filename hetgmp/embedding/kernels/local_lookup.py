"""The one-rank lookup in two kernels, each next to its torch reference: ``mark_local`` (clamp +
range flag + leader map) and ``take_local`` (rows + leaders + distinct-row count); the Triton
code is in :mod:`.rows_triton`, the backend choice in :mod:`.rows`."""

from __future__ import annotations

import torch

from hetgmp.embedding.kernels.launcher import _kernels, launch, on_device, row_tiles


def mark_local(
    ids: torch.Tensor,
    pos_map: torch.Tensor,
    flag: torch.Tensor,
    step_count: torch.Tensor,
    num_rows: int,
    *,
    backend: str = "torch",
) -> torch.Tensor:
    """First half of a one-rank lookup (:class:`DistributedEmbedding`'s fast path), one kernel:
    ``slots = ids.clamp(0, num_rows - 1)`` (returned, int64, the shape of ``ids``, which may
    have any shape; ``i`` below is a position in the flattened ids); ``pos_map[slots[i]] = i`` (int32
    per-row map; when a row repeats, any one occurrence wins); ``flag`` (int32 ``[1]``, zero
    on entry) becomes > 0 if an id was out of range; ``step_count`` (int64 ``[1]``) is zeroed
    for :func:`take_local` to count into."""
    n = ids.numel()
    if backend == "torch":
        slots = ids.clamp(0, num_rows - 1)
        flag.copy_(torch.maximum(flag, (slots != ids).any().to(flag.dtype)))
        flat = slots.reshape(-1)
        pos_map.index_copy_(0, flat, torch.arange(n, dtype=torch.int32, device=ids.device))
        step_count.zero_()
        return slots
    k = _kernels()
    triton, kernel = k.triton, k.mark_local
    ids = ids.contiguous()  # (the kernel reads it as a flat array)
    slots = torch.empty_like(ids)
    block = 1024
    with on_device(ids):
        launch(kernel, (max(1, triton.cdiv(n, block)),),
               (ids, slots, pos_map, flag, step_count, n, num_rows), {"BLOCK": block})  # fmt: skip
    return slots


def take_local(
    table: torch.Tensor,
    slots: torch.Tensor,
    pos_map: torch.Tensor,
    flag: torch.Tensor,
    step_count: torch.Tensor,
    total_count: torch.Tensor,
    *,
    backend: str = "torch",
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Second half (after :func:`mark_local` with the same ``slots`` and ``pos_map``), one
    kernel: returns ``(table[slots], lead)`` where ``lead[i] = pos_map[slots[i]]`` is the
    position of the occurrence that won row ``slots[i]`` (so ``lead[i] == i`` for exactly one
    occurrence per distinct row); adds the number of distinct rows to ``step_count`` and
    ``total_count`` (int64 ``[1]`` each) and clears ``flag`` for the next call. ``slots`` may
    have any shape ``[...]``: the rows come as ``[..., D]`` (a tensor of its own, not a view),
    ``lead`` flat ``[n]`` over the flattened slots. ``out_dtype`` (default: the table's): the
    rows' dtype, e.g. bf16 under autocast (converted in the kernel: no separate cast pass)."""
    n = slots.numel()
    d = table.shape[1]
    if backend == "torch":
        flat = slots.reshape(-1)
        lead = pos_map.index_select(0, flat)
        k = (lead == torch.arange(n, dtype=torch.int32, device=slots.device)).sum()
        step_count += k
        total_count += k
        flag.zero_()
        if out_dtype is not None and out_dtype != table.dtype:
            return table.index_select(0, flat).to(out_dtype).view(*slots.shape, d), lead
        if slots.dim() == 1:
            return table.index_select(0, flat), lead
        out = torch.empty(*slots.shape, d, dtype=table.dtype, device=table.device)
        torch.index_select(table, 0, flat, out=out.view(n, d))
        return out, lead
    k = _kernels()
    triton, kernel = k.triton, k.take_local
    dtype = table.dtype if out_dtype is None else out_dtype
    out = torch.empty(*slots.shape, d, dtype=dtype, device=table.device)
    lead = torch.empty(n, dtype=torch.int32, device=table.device)
    slots = slots.contiguous()  # (the kernel reads it as a flat array)
    block_r, block_d = row_tiles(triton, d)
    with on_device(table):
        launch(
            kernel, (max(1, triton.cdiv(n, block_r)),),
            (table, slots, out, n, pos_map, lead, step_count, total_count, flag),
            {"D": d, "BLOCK_R": block_r, "BLOCK_D": block_d},
        )  # fmt: skip
    return out, lead
