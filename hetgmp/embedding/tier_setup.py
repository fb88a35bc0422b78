"""Setting a table up on the host tier (``--rows-on host``, :mod:`.tiered`): what is
supported so far, and the tier over a one-rank store's rows."""

from __future__ import annotations

import numpy as np
import torch

from hetgmp.embedding.memory import RESERVE, SLACK, TableMemoryError
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.store import RowStore
from hetgmp.embedding.tiered import TieredRows, budget_rows

ROWS_ON = ("device", "host")


def check_rows_on(rows_on: str, cache_budget: float, *, world: int, device: torch.device,
                  cuda_graphs: bool) -> None:  # fmt: skip
    """Refuse what the host tier does not support yet (``--rows-on host``)."""
    if rows_on not in ROWS_ON:
        raise ValueError(f"rows_on must be one of {ROWS_ON}, got {rows_on!r}")
    if rows_on == "device":
        return
    budget_rows(1, cache_budget)  # (the fraction's check)
    if world > 1:
        raise ValueError(
            f"--rows-on host is supported on one rank only so far (this job has {world}); "
            "train with --rows-on device, or on one GPU"
        )
    if device.type == "cuda" and cuda_graphs:
        raise ValueError(
            "--rows-on host does not run inside CUDA graphs yet (a prefetch decides residency "
            "on the host); pass --no-cuda-graphs with it"
        )


def tier_rows_of(
    store: RowStore, opt: SparseOptimizer, device: torch.device, cache_budget: float,
    counts: torch.Tensor | np.ndarray | None, *, overlap: bool = True,
) -> TieredRows:  # fmt: skip
    """A host tier over a one-rank ``store`` (allocated in host memory, slot = id): the tier
    keeps the store's rows as its host rows, and the store's ``weight`` / ``opt_state`` point
    at them, so saving and loading rows by id work on host memory (flush / reload the tier
    around them). On CUDA the rows are page-locked in place (no second copy of them)."""
    if store.world != 1:
        raise ValueError("a host tier holds the rows of a one-rank table")
    check_cache_fits(store.num_rows, store.dim, cache_budget, opt.state_width, device)
    tier = TieredRows(
        store.weight, store.opt_state, device=device, opt=opt, counts=counts, adopt=True,
        budget=budget_rows(store.num_rows, cache_budget), overlap=overlap,
    )  # fmt: skip
    store.weight = store.weight_full = tier.host_weight
    store.opt_state = store.opt_state_full = tier.host_state
    return tier


def check_cache_fits(
    num_rows: int, dim: int, cache_budget: float, state_width: int, device: torch.device,
    free: int | None = None,
) -> None:  # fmt: skip
    """Refuse a device cache that cannot fit ``device`` (CUDA; ``free``: its free bytes,
    default asked of CUDA) before anything is allocated: the cache's rows and state and the
    device slot map (8 bytes a row of the table)."""
    if device.type != "cuda" and free is None:
        return
    if free is None:
        free = int(torch.cuda.mem_get_info(device)[0])
    rows = budget_rows(num_rows, cache_budget)
    need = rows * 4 * (dim + state_width) + num_rows * 8
    usable = max(0, int(free * SLACK) - RESERVE)
    if need > usable:
        gib = 2**30
        fits = max(0.0, (usable - num_rows * 8) / (4 * (dim + state_width)) / num_rows)
        raise TableMemoryError(
            f"--cache-budget {cache_budget}: a device cache of {rows:,} of {num_rows:,} rows "
            f"needs {need / gib:.1f} GiB on {device}, which has {free / gib:.1f} GiB free "
            f"({usable / gib:.1f} GiB usable): take --cache-budget {fits:.3f} or less"
        )
