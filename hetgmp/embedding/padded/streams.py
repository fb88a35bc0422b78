"""The streams of the multi-rank step's graph and their priorities (a leaf: the exchange, the
read-ahead, the owner's update and the trainer's graphed step all make theirs here)."""

from __future__ import annotations

import torch

# Stream priorities in the multi-rank step's graph (a kernel node keeps its capture stream's
# priority: torch instantiates graphs with cudaGraphInstantiateFlagUseNodePriority): the
# exchange's side stream highest, the step's own stream next, the plan's stream the default
# (the lowest), so the plan yields SMs to the forward and the dense optimizer to the exchange's
# chain (2 H100s, batch 8192: the forward ran ~45 us slower beside the plan). Measured there
# (bench/results/gpu/priorities, 2026-11-26): 19.77M -> 19.98M samples/s, 1.53x -> 1.55x of one
# GPU, results unchanged (the GPU check passes with it).
PRIORITIES = True


def priority_stream(device: torch.device, role: str) -> torch.cuda.Stream:
    """A new stream for ``role`` (``"exchange"``: the exchange's side stream, ``"step"``: the
    stream a multi-rank step's graph is captured on), at its priority when
    :data:`PRIORITIES` is on (the default), else at the default one."""
    if not PRIORITIES:
        return torch.cuda.Stream(device)
    least, greatest = torch.cuda.Stream.priority_range()  # type: ignore[call-arg]
    # (e.g. 0, -5: a lower number is a higher priority)
    level = greatest if role == "exchange" else max(greatest, least - 1)
    return torch.cuda.Stream(device, priority=level)
