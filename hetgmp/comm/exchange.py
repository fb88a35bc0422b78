"""The variable-size all-to-all exchange: one code path for gloo CPU and NCCL GPU tensors.

A step first exchanges a small ``[world, K]`` int64 table of counts (``exchange_sizes`` /
``exchange_counts``; the only host round trip), then the payload with ``all_to_all_single`` and
per-peer split sizes (``exchange_payload``), or, with fixed capacities, between preallocated
``[world, S]`` buffers with equal splits and no sizes at all (``exchange_fixed``: what the
padded embedding exchange uses, so the buffers stay at the addresses its CUDA graphs use). Payloads are flat 1-D float32 buffers; int64 fields (ids, versions) are
bit-cast into pairs of float32 lanes with :func:`pack_i64` / :func:`unpack_i64` so ids,
versions, values and gradients travel in one message. Collectives only copy bytes, so the
bit patterns (even NaN-looking ones) arrive intact.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hetgmp.comm.collectives import guarded
from hetgmp.comm.env import DistEnv


def pack_i64(x: torch.Tensor) -> torch.Tensor:
    """int64 ``[n]`` -> float32 ``[2n]`` with the same bytes."""
    return x.to(torch.int64).contiguous().view(torch.float32)


def unpack_i64(x: torch.Tensor) -> torch.Tensor:
    """float32 ``[2n]`` -> int64 ``[n]`` with the same bytes."""
    return x.contiguous().view(torch.int64)


def exchange_counts(env: DistEnv, send: torch.Tensor, what: str = "size exchange") -> torch.Tensor:
    """All-to-all of a ``[world, K]`` int64 table: row ``j`` goes to rank ``j``; returns the
    ``[world, K]`` table received (row ``i`` came from rank ``i``) on the CPU."""
    if env.group is None or env.world_size == 1:
        return send.cpu().clone()
    send = send.to(device=env.device, dtype=torch.int64).contiguous()
    recv = torch.empty_like(send)
    with guarded(env, what):
        dist.all_to_all_single(recv, send, group=env.group)
    return recv.cpu()


def exchange_payload(
    env: DistEnv,
    send: torch.Tensor,
    send_splits: list[int],
    recv_splits: list[int],
    what: str = "payload exchange",
) -> torch.Tensor:
    """Variable-size all-to-all of a flat buffer: ``send_splits[j]`` elements go to rank ``j``,
    ``recv_splits[i]`` elements arrive from rank ``i`` (concatenated in rank order)."""
    if env.group is None or env.world_size == 1:
        return send.clone()
    recv = torch.empty(sum(recv_splits), dtype=send.dtype, device=send.device)
    with guarded(env, what):
        dist.all_to_all_single(
            recv,
            send.contiguous(),
            output_split_sizes=recv_splits,
            input_split_sizes=send_splits,
            group=env.group,
        )
    return recv


def exchange_fixed(
    env: DistEnv, send: torch.Tensor, recv: torch.Tensor, what: str = "payload exchange"
) -> torch.Tensor:
    """Equal-split all-to-all between preallocated ``[world, S]`` buffers (row ``j`` of
    ``send`` goes to rank ``j``; row ``i`` of ``recv`` comes from rank ``i``); no sizes, so it
    needs nothing from the host. Returns ``recv``."""
    if env.group is None or env.world_size == 1:
        return recv.copy_(send)
    with guarded(env, what):
        dist.all_to_all_single(recv, send, group=env.group)
    return recv


def exchange_sizes(
    env: DistEnv, send: torch.Tensor, what: str = "size exchange"
) -> tuple[torch.Tensor, torch.Tensor]:
    """All-to-all of a ``[world, K]`` int64 table with ONE device->host copy.

    Returns ``(received, both)``: ``received`` (``[world, K]``, row ``i`` from rank ``i``) stays
    on the device for device-side index math, ``both`` is ``[2, world, K]`` on the CPU:
    ``both[0]`` the table sent, ``both[1]`` the table received. The copy is the step's only
    wait for the device; everything the host needs to size the payloads travels in it."""
    send = send.to(device=env.device, dtype=torch.int64).contiguous()
    if env.group is None or env.world_size == 1:
        recv = send
    else:
        recv = torch.empty_like(send)
        with guarded(env, what):
            dist.all_to_all_single(recv, send, group=env.group)
    return recv, torch.stack([send, recv]).cpu()
