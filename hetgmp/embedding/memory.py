"""What a rank's share of the table takes in device memory, checked before it is allocated.

Why: a table too large for the GPU failed deep inside an allocation (or the driver) after the
data set and plan were loaded; a user with a table larger than one GPU needs to hear, before
training, how much it needs, how much there is, and that several GPUs with a plan split it.
"""

from __future__ import annotations

import math

import torch

SLACK = 0.9  # the share of the free memory the table may take (the model, batches, graphs)
RESERVE = 2 << 30  # bytes kept for everything else besides that share


class TableMemoryError(ValueError):
    """This rank's rows do not fit its device (the message says what to do)."""


def table_bytes(
    num_rows: int, dim: int, stored: int, mirrors: int, state_width: int, *, ranks: int = 1
) -> int:
    """Device bytes of a rank's table: stored rows (values, versions, optimizer state), the
    mirrors' accumulators and pending counts, and the id -> slot / block maps of every row
    (``ranks`` > 1: the batch plan's leader and count maps and the epoch-start scan's row
    stamps and counts too, ``[num_rows]`` int32 each)."""
    rows = (stored + 1) * (4 * dim + 8 + 4 * state_width)
    mirror_part = (mirrors + 1) * (2 * 4 * dim + 8)
    per_row = 4 + 4 + 4 if ranks == 1 else 4 + 4 + 4 * 4  # (slot, block, the step's maps)
    maps = num_rows * per_row + stored * 8
    return rows + mirror_part + maps


BALANCE = 1.05  # a plan's rows per rank over the mean (partition.py balances rows to ~1.0)
MIRRORS = 0.01  # mirrored rows per rank, as a share of all rows (the card's --store_rate)


def gpus_needed(
    num_rows: int, dim: int, state_width: int, usable: int, *, at_least: int
) -> tuple[int, int]:
    """The fewest GPUs (``>= at_least``) whose share of the rows (a plan's, with
    :data:`BALANCE` and :data:`MIRRORS`) fits ``usable`` bytes each, and that share's bytes."""
    for k in range(max(1, at_least), 1 << 16):
        mirrors = math.ceil(num_rows * MIRRORS) if k > 1 else 0
        stored = math.ceil(num_rows / k * BALANCE) + mirrors
        share = table_bytes(num_rows, dim, stored, mirrors, state_width, ranks=k)
        if share <= usable:
            return k, share
    return 1 << 16, share  # (the id maps alone exceed the device: no plan helps)


def check_fits(
    num_rows: int, dim: int, stored: int, mirrors: int, state_width: int, *, rank: int,
    world: int, device: torch.device, free: int | None = None,
) -> None:  # fmt: skip
    """Raise :class:`TableMemoryError` if this rank's rows cannot fit ``device`` (CUDA; on
    CPU nothing is checked). ``free``: the device's free bytes (default: asked of CUDA)."""
    if device.type != "cuda" and free is None:
        return
    if free is None:
        free, _total = torch.cuda.mem_get_info(device)
    need = table_bytes(num_rows, dim, stored, mirrors, state_width, ranks=world)
    usable = max(0, int(free * SLACK) - RESERVE)
    if need <= usable:
        return
    gpus, share = gpus_needed(num_rows, dim, state_width, usable, at_least=world + 1)
    gib = 2**30
    raise TableMemoryError(
        f"rank {rank}: this rank's embedding rows need {need / gib:.1f} GiB on {device} "
        f"({stored:,} stored rows of {dim} float32 values with their optimizer state and "
        f"versions, {mirrors:,} of them mirrors, and the id maps of {num_rows:,} rows), but the "
        f"device has {free / gib:.1f} GiB free ({usable / gib:.1f} GiB usable for rows). "
        f"Train on more GPUs with a plan, which splits the rows among them: "
        f"`python partition/partition.py -n {gpus} -o part.npz --data DATASET`, then "
        f"`mpirun -np {gpus} python examples/hetuctr.py --partition part.npz ...` (about "
        f"{share / gib:.1f} GiB of rows per GPU); or, on one GPU, the rows in host memory with "
        f"the hottest cached on it: --rows-on host --cache-budget 0.1; or a "
        f"smaller --embed_dim"
    )
