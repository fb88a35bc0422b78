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
