"""Small collectives used by the trainer and the embedding runtime.

Every function takes the :class:`DistEnv` explicitly and is a no-op (returns its input) for a
single process. Failures of the underlying torch.distributed call (peer died, timeout) are
re-raised as :class:`CommError` naming this rank and the operation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hetgmp.comm.env import DistEnv
from hetgmp.comm.errors import CommError


@contextlib.contextmanager
def guarded(env: DistEnv, what: str) -> Iterator[None]:
    """Turn a torch.distributed failure inside the block into a clear :class:`CommError`."""
    try:
        yield
    except CommError:
        raise
    except RuntimeError as err:  # DistBackendError and gloo/NCCL errors are RuntimeErrors
        raise CommError(
            f"rank {env.rank}/{env.world_size}: {what} failed; another rank probably died, "
            f"raised, or did not answer within the process-group timeout ({err})"
        ) from err


def _active(env: DistEnv) -> bool:
    return env.group is not None and env.world_size > 1


def barrier(env: DistEnv) -> None:
    """Wait for every rank."""
    if _active(env):
        with guarded(env, "barrier"):
            group_barrier(env)


def group_barrier(env: DistEnv) -> None:
    """``dist.barrier`` on ``env``'s group, naming the CUDA device on NCCL (else torch warns
    once per process that it guesses the device: every user saw that line at a job's end)."""
    if env.backend == "nccl" and env.device.type == "cuda" and env.device.index is not None:
        dist.barrier(group=env.group, device_ids=[env.device.index])
    else:
        dist.barrier(group=env.group)


def all_reduce_sum(env: DistEnv, value: Any) -> Any:
    """Sum ``value`` over ranks. Accepts a tensor (reduced in place and returned), a numpy
    array, or a Python int/float (returned with the same type)."""
    if not _active(env):
        return value
    if isinstance(value, torch.Tensor):
        # NCCL groups reduce device tensors only; callers may hold host tensors (log counters).
        t = value if value.device == env.device else value.to(env.device)
        with guarded(env, "all_reduce_sum"):
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=env.group)
        if t is not value:
            value.copy_(t)
        return value
    if isinstance(value, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(value)).to(env.device)
        with guarded(env, "all_reduce_sum"):
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=env.group)
        return t.cpu().numpy()
    if isinstance(value, (bool, int, float)):
        dtype = torch.float64 if isinstance(value, float) else torch.int64
        t = torch.tensor([value], dtype=dtype, device=env.device)
        with guarded(env, "all_reduce_sum"):
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=env.group)
        return type(value)(t.item()) if not isinstance(value, bool) else int(t.item())
    raise TypeError(f"all_reduce_sum: unsupported value type {type(value).__name__}")


def any_true(env: DistEnv, flag: bool) -> bool:
    """True when ``flag`` is true on at least one rank (e.g. 'some rank still has batches')."""
    if not _active(env):
        return bool(flag)
    t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=env.device)
    with guarded(env, "any_true"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=env.group)
    return bool(t.item())


def all_gather_object(env: DistEnv, obj: Any) -> list[Any]:
    """Every rank's (picklable) ``obj``, in rank order."""
    if not _active(env):
        return [obj]
    out: list[Any] = [None] * env.world_size
    with guarded(env, "all_gather_object"):
        dist.all_gather_object(out, obj, group=env.group)
    return out
