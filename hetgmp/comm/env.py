"""The process environment: who am I, how many are we, which device do I drive.

Distributed state is a value (:class:`DistEnv`) passed around explicitly, never a module global.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch


@dataclasses.dataclass
class DistEnv:
    """One rank's view of the job.

    ``group`` is the torch.distributed process group for collectives (None for a single
    process). ``launcher`` says how we were started: ``mpirun``, ``torchrun`` or ``single``.
    ``groups``: extra process groups by purpose (see the field). ``closers``: what must be
    released before the process groups are destroyed (called by
    :func:`hetgmp.comm.launch.shutdown`, newest first): CUDA graphs that captured NCCL
    collectives hold their communicator, whose destruction then waits for them forever.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    backend: str = "none"
    launcher: str = "single"
    group: Any = None
    closers: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    # process groups made for one purpose (e.g. the padded exchange's captured collectives),
    # created collectively once and shared by everything using this env: every NCCL
    # communicator alive keeps proxy threads and buffers, so one per table would pile up
    groups: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1 or self.group is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def single(cls, device: str | torch.device = "cpu") -> DistEnv:
        """A one-process environment with no collectives."""
        return cls(device=torch.device(device))


def purpose_env(env: DistEnv, purpose: str) -> DistEnv:
    """(Collective, NCCL) ``env`` with a process group of its own for ``purpose`` (the same
    ranks; made at the first call on this env, shared by later ones). Why: collectives captured
    in CUDA graphs must not share a communicator with eager calls, nor with collectives of
    another stream. NCCL sets a communicator up at its first collective, which must not happen
    inside a capture: one all-reduce runs here."""
    import torch.distributed as dist

    group = env.groups.get(purpose)
    if group is None:
        ranks = dist.get_process_group_ranks(env.group)
        group = env.groups[purpose] = dist.new_group(ranks, backend="nccl")
        dist.all_reduce(torch.zeros(1, device=env.device), group=group)
    return dataclasses.replace(env, group=group)
