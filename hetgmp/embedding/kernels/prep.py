"""The batch plan (:meth:`hetgmp.embedding.batch.BatchPlanner.prepare`) in five Triton kernels
(:mod:`.prep_triton`) instead of ~35 torch ops; its reference is the torch code of
``BatchPlanner`` (``backend="torch"``), which it matches exactly: the same leaders (the first
occurrence of each row), the same stable block order, dtypes and shapes. Why: on 2 H100s at
batch 8192 x 26 the torch plan took ~223 us of a 1.4 ms step (a 4-pass radix sort of keys
below ``3w + 1``, a binary search, an int64 ``index_add_``, many small launches); the one-GPU
lookup does the same leader trick in two kernels.

Fixed-size launches and no host sync: capturable in a CUDA graph. The leader map (``min_map``,
``[num_rows]`` int32) must hold ``INT32_MAX`` everywhere between calls (:func:`new_min_map`);
the kernels leave it so.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch

from hetgmp.embedding.kernels.launcher import _kernels, interpreted, launch, on_device

BLOCK = 1024  # occurrences per program (<= 1024: prep_mark's 32-bit sort key, prep_triton)
SCAN_TILE = 4096  # histogram entries per step of the one-program scan
# One atomic per distinct row of a program (its ids and leaders sorted in the program) rather
# than one per occurrence: hot rows serialised them (2 H100s, batch 65536 x 26: the plan took
# 546 us, 312 us with this). Off: the plain atomics (the same result; Triton's interpreter
# runs the in-program sorts slowly: its checks take this path unless they ask, see
# tests/test_prep_kernels.py; the interpreter is only ever chosen by that variable).
AGGREGATE = not interpreted()
# A [B, F] batch's leaders marked by field (prep_triton.prep_mark_fields_kernel: 64 samples of
# one field per program, a 64-entry sort) instead of by blocks of 1024 consecutive ids (a
# 1024-entry sort). The same plan. On since measured with EARLY_ZERO on 2 H100s (2026-11-26,
# bench/results/gpu/zero_mark/): the user's command 1.53x -> 1.56x one GPU at batch 8192. Off in
# Triton's interpreter, as AGGREGATE: its many small sorts doubled the padded training tests'
# time there (26 s vs 13 s); tests/test_prep_kernels.py turns it on and checks it.
MARK_BY_FIELD = not interpreted()
# Samples of one field per program of the marking by field. 128 since swept on 2 H100s
# (2026-11-27, bench/results/gpu/mark_samples/): the plan alone, CUDA graph, world 2: 35 us at
# batch 8192 with 64 or 128, 244 -> 207 us at 65536 (256: 36 / 201); 178 us since the counts
# and places are stored for leaders only (bench/results/gpu/ceiling_s23/call6_plan_ab/).
MARK_SAMPLES = 128
INT32_MAX = 2**31 - 1


class PlanArrays(NamedTuple):
    """What :func:`prepare_triton` computes (the fields of ``batch.Prep`` of the same name)."""

    bad: torch.Tensor  # () bool
    u: torch.Tensor  # [n] int64
    cnt: torch.Tensor  # [n] int64
    slot: torch.Tensor  # [n] int64
    inv: torch.Tensor  # [n] int32
    blocks: torch.Tensor  # [3w] int64


def new_min_map(num_rows: int, device: torch.device) -> torch.Tensor:
    """The leader map :func:`prepare_triton` needs: ``[num_rows]`` int32, all ``INT32_MAX``."""
    return torch.full((num_rows,), INT32_MAX, dtype=torch.int32, device=device)


def _launch_plan(
    k: Any, flat: torch.Tensor, slot_of: torch.Tensor, block_of: torch.Tensor,
    min_map: torch.Tensor, out: PlanArrays, world: int, fields: int | None = None,
    cnt_map: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """The five launches (see :mod:`.prep_triton`) into ``out`` (marked by field where
    :data:`MARK_BY_FIELD` is on, the batch is ``[B, fields]`` and a ``cnt_map`` is given)."""
    triton = k.triton
    n, num_rows, nkey = flat.numel(), slot_of.numel(), 3 * world
    kp = triton.next_power_of_2(nkey + 1)
    progs = max(1, triton.cdiv(n, BLOCK))
    dev = flat.device
    cnt_pos = torch.empty(n, dtype=torch.int64, device=dev)  # counts in position order
    n4 = -(-n // 4) * 4  # (each scratch array 16-byte aligned: kp is a multiple of 4)
    lead, key, pos, hist, off, start, bad_p = torch.empty(
        3 * n4 + 2 * progs * kp + kp + progs, dtype=torch.int32, device=dev
    ).split([n4, n4, n4, progs * kp, progs * kp, kp, progs])
    b = {"BLOCK": BLOCK}
    grid = (progs,)
    agg = {"AGG": AGGREGATE, **b}
    by_field = bool(MARK_BY_FIELD and fields and n and n % fields == 0 and cnt_map is not None)
    cmap = cnt_map if cnt_map is not None else min_map  # (a stand-in the kernels never read)
    if by_field:
        assert fields is not None
        fgrid = (triton.cdiv(n // fields, MARK_SAMPLES), fields)
        launch(k.prep_mark_fields, fgrid, (flat, min_map, cmap, n // fields, num_rows),
               {"F": fields, "BS": MARK_SAMPLES, "LB": MARK_SAMPLES.bit_length() - 1})  # fmt: skip
    else:
        launch(k.prep_mark, grid, (flat, min_map, cnt_pos, bad_p, n, num_rows), agg)
    field = {"BY_FIELD": True} if by_field else {}
    launch(k.prep_key, grid,
           (flat, min_map, block_of, lead, key, cnt_pos, hist, bad_p, cmap, n, num_rows),
           {"NKEY": nkey, "KP": kp, **agg, **field})  # fmt: skip
    launch(k.prep_scan, (1,),
           (hist, off, start, out.blocks, bad_p, out.bad.view(torch.uint8), progs),
           {"NKEY": nkey, "KP": kp, "CH": max(1, SCAN_TILE // kp)})  # fmt: skip
    launch(k.prep_place, grid,
           (flat, key, cnt_pos, off, start, slot_of, min_map, out.u, out.cnt, out.slot, pos, cmap,
            n, num_rows), {"NKEY": nkey, "KP": kp, **b, **field})  # fmt: skip
    launch(k.prep_inv, grid, (lead, pos, out.inv, n), b)


def prepare_triton(
    ids: torch.Tensor, slot_of: torch.Tensor, block_of: torch.Tensor, min_map: torch.Tensor,
    world: int, cnt_map: torch.Tensor | None = None, out: PlanArrays | None = None,
) -> PlanArrays:  # fmt: skip
    """The batch plan of ``ids`` (any shape, int64; see ``batch.Prep``) for the maps
    ``slot_of`` / ``block_of`` (``[num_rows]`` int32, values of ``block_of`` in ``[0, 3w)``),
    with the leader map ``min_map`` (:func:`new_min_map`; left as it was found) and, for
    :data:`MARK_BY_FIELD`, the rows' count map ``cnt_map`` (``[num_rows]`` int32, zero: left
    so). ``out``: arrays to write the plan into (their shapes and dtypes as made here), e.g. a
    preparation ring's fixed buffers, which then need no copy. Every element is written today,
    padding too (``batch.Prep``: unspecified, so a later plan may leave it)."""
    if slot_of.dtype != torch.int32 or block_of.dtype != torch.int32:
        raise ValueError(
            f"slot_of / block_of must be int32, got {slot_of.dtype} / {block_of.dtype}"
        )
    if min_map.shape != slot_of.shape or min_map.dtype != torch.int32:
        raise ValueError(f"min_map must be int32 {tuple(slot_of.shape)}, got {min_map.dtype} "
                         f"{tuple(min_map.shape)}")  # fmt: skip
    flat = ids.reshape(-1).contiguous()
    n, dev = flat.numel(), flat.device
    if n >= 2**31 - BLOCK:
        raise ValueError(f"a batch of {n} ids is too large (positions are int32)")
    if out is not None:
        _check_out(out, n, world)
    else:
        out = PlanArrays(
            bad=torch.empty((), dtype=torch.bool, device=dev),
            u=torch.empty(n, dtype=torch.int64, device=dev),
            cnt=torch.empty(n, dtype=torch.int64, device=dev),
            slot=torch.empty(n, dtype=torch.int64, device=dev),
            inv=torch.empty(n, dtype=torch.int32, device=dev),
            blocks=torch.empty(3 * world, dtype=torch.int64, device=dev),
        )
    fields = int(ids.shape[-1]) if ids.dim() == 2 else None
    with on_device(flat):
        _launch_plan(_kernels(), flat, slot_of, block_of, min_map, out, world, fields, cnt_map)
    return out


def _check_out(out: PlanArrays, n: int, world: int) -> None:
    want = {"bad": ((), torch.bool), "u": ((n,), torch.int64), "cnt": ((n,), torch.int64),
            "slot": ((n,), torch.int64), "inv": ((n,), torch.int32),
            "blocks": ((3 * world,), torch.int64)}  # fmt: skip
    for name, (shape, dtype) in want.items():
        t = getattr(out, name)
        if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
            raise ValueError(
                f"plan output {name}: {tuple(t.shape)} {t.dtype}, want {shape} {dtype}"
            )


def trial(device: torch.device) -> bool:
    """Whether the kernels give a small plan worked out by hand (``resolve("auto")``'s trial
    launch): ids ``[2, 0, 2, 3, 9]`` (9 clamped to 3: bad) of a 4-row table, world 1."""
    t = functools.partial(torch.tensor, device=device)
    got = prepare_triton(
        t([2, 0, 2, 3, 9]), t([5, 6, 7, -1], dtype=torch.int32), t([1, 0, 2, 0], dtype=torch.int32),
        new_min_map(4, device), 1,
    )  # fmt: skip
    want = {"inv": [2, 1, 2, 0, 0], "blocks": [1, 1, 1]}
    distinct = {"u": [3, 0, 2], "cnt": [2, 1, 2], "slot": [-1, 5, 7]}  # (the padding: any)
    return (
        bool(got.bad)
        and all(getattr(got, f).tolist() == v for f, v in want.items())
        and all(getattr(got, f)[:3].tolist() == v for f, v in distinct.items())
    )
