"""Setting a table up on the host tier (``--rows-on host``, :mod:`.tiered`): what is
supported so far, the tier over a one-rank store's rows, and several ranks' owned rows on a
tier each (:mod:`.tier_owned`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hetgmp.embedding.init import initial_rows
from hetgmp.embedding.memory import RESERVE, SLACK, TableMemoryError
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.store import RowStore
from hetgmp.embedding.tier_device import DeviceTier
from hetgmp.embedding.tier_host import SetupClock
from hetgmp.embedding.tier_owned import OwnedTier
from hetgmp.embedding.tiered import TieredRows, budget_rows, hottest_first

ROWS_ON = ("device", "host")
# One rank's host tier decided on the device (.tier_device: no host work per step, the step one
# CUDA graph) instead of on the host (.tiered, still that of several ranks' owned rows). On
# since measured on an H100 (2026-11-26, bench/results/gpu/host_tier_graph/): a 10 % cache at
# 0.90x / 0.92x the all-on-GPU step (batch 8192 / 65536), the host-decided tier 0.14x.
DEVICE_TIER = True


def check_rows_on(
    rows_on: str, cache_budget: float, *, world: int, device: torch.device, cuda_graphs: bool,
    exchange: str = "exact", sync: str = "collective",
) -> None:  # fmt: skip
    """Refuse what the host tier does not support yet (``--rows-on host``); ``exchange`` /
    ``sync``: the table's, resolved (several ranks: the exact collective exchange only)."""
    if rows_on not in ROWS_ON:
        raise ValueError(f"rows_on must be one of {ROWS_ON}, got {rows_on!r}")
    if rows_on == "device":
        return
    budget_rows(1, cache_budget)  # (the fraction's check)
    if world > 1 and (sync != "collective" or exchange not in ("exact", "padded")):
        raise ValueError(
            f"--rows-on host with several ranks runs the collective exchange only "
            f"(this table: --sync {sync}, --exchange {exchange}); pass --sync collective"
        )
    # (several ranks on the padded exchange: the whole-step graph, whose epoch starts hold an
    # epoch's owned rows resident, .tier_epoch; the trainer refuses it elsewhere)
    graphs_ok = exchange == "padded" if world > 1 else DEVICE_TIER
    if device.type == "cuda" and cuda_graphs and not graphs_ok:
        raise ValueError(
            "--rows-on host does not run inside CUDA graphs yet (a prefetch decides residency "
            "on the host); pass --no-cuda-graphs with it"
            + (" (or, several ranks, --exchange padded: its whole-step graph holds each "
               "epoch's rows)" if world > 1 else "")
        )  # fmt: skip


def check_owned_flow(table: Any, whole_step: bool) -> None:
    """Refuse several ranks' host tier on the padded exchange outside the whole-step flow:
    its eager step never makes the peers' reads and pushes resident (the exact exchange's
    step does, and the whole-step flow holds an epoch's rows, :mod:`.tier_epoch`)."""
    if getattr(table, "owned", None) is not None and table.exchange == "padded" and not whole_step:
        raise ValueError(
            "--rows-on host with several ranks and --exchange padded needs the whole step as "
            "one CUDA graph (CUDA, --cuda-graphs, samples resident on the device); pass "
            "--exchange exact otherwise"
        )


def tiered_store(
    num_rows: int, dim: int, *, rank: int, world: int, device: torch.device, owner: np.ndarray,
    mirrors: np.ndarray, opt: SparseOptimizer, seed: int, init_scale: float,
    cache_budget: float, counts: torch.Tensor | np.ndarray | None,
    clock: SetupClock | None = None,
) -> tuple[RowStore, TieredRows | DeviceTier, OwnedTier | None]:  # fmt: skip
    """The store and its host tier (``counts``: per-row access frequencies of the whole
    table, or None: the initial residents): one rank, the store in host memory with the tier
    over it (:func:`tier_rows_of`); several, the owned rows in host memory with the store's
    own region as their device cache (:class:`OwnedTier`: None for one rank). The initial
    rows are hashed on ``device`` (CUDA: seconds, not minutes, for tens of millions of rows);
    ``clock`` times and reports the phases."""
    kw: dict[str, Any] = dict(rank=rank, world=world, owner=owner, mirrors=mirrors, opt=opt,
                              seed=seed, init_scale=init_scale)  # fmt: skip
    clock = clock if clock is not None else SetupClock()
    if world == 1:
        check_cache_fits(num_rows, dim, cache_budget, opt.state_width, device,
                         map_bytes=_map_bytes())  # (before init)  # fmt: skip
        with clock.phase("init", rows=num_rows, bytes=num_rows * 4 * (dim + opt.state_width)):
            store = RowStore(num_rows, dim, device=torch.device("cpu"), init_on=device, **kw)
        tier = tier_rows_of(store, opt, device, cache_budget, counts, clock=clock)
        return store, tier, None
    return _owned_tier(num_rows, dim, device, cache_budget, counts, clock, kw)


def _owned_tier(
    num_rows: int, dim: int, device: torch.device, cache_budget: float,
    counts: torch.Tensor | np.ndarray | None, clock: SetupClock, kw: dict[str, Any],
) -> tuple[RowStore, TieredRows, OwnedTier]:  # fmt: skip
    """(Several ranks) the owned rows in host memory, the store's own region their cache."""
    rank, owner, opt = kw["rank"], kw["owner"], kw["opt"]
    seed, init_scale = kw["seed"], kw["init_scale"]
    own_ids = np.flatnonzero(owner == rank)
    if not own_ids.size:
        raise ValueError(f"rank {rank} owns no rows: --rows-on host has nothing to hold")
    budget = budget_rows(own_ids.size, cache_budget)
    own_counts = None if counts is None else torch.as_tensor(counts)[torch.from_numpy(own_ids)]
    first = hottest_first(own_counts, own_ids.size)[:budget]
    store = RowStore(num_rows, dim, device=device, resident=own_ids[first.numpy()], **kw)
    cpu = torch.device("cpu")
    sw = opt.state_width
    with clock.phase("init", rows=own_ids.size, bytes=own_ids.size * 4 * (dim + sw + 2)):
        rows = initial_rows(
            torch.from_numpy(own_ids), dim, seed=seed, scale=init_scale, compute=device
        )
        state = opt.new_state(own_ids.size, cpu)
    tier = TieredRows(
        rows, state, device=device, budget=budget, opt=opt, counts=own_counts, adopt=True,
        version=torch.zeros(own_ids.size, dtype=torch.int64), clock=clock,
        cache=(store.weight_full[:budget], store.opt_state_full[: budget * sw],
               store.version_full[:budget]),
    )  # fmt: skip
    assert torch.equal(tier.row_of, first)  # (the store's own slots hold the tier's residents)
    return store, tier, OwnedTier(store, tier, own_ids)


def tier_rows_of(
    store: RowStore, opt: SparseOptimizer, device: torch.device, cache_budget: float,
    counts: torch.Tensor | np.ndarray | None, *, overlap: bool = True,
    clock: SetupClock | None = None,
) -> TieredRows | DeviceTier:  # fmt: skip
    """A host tier over a one-rank ``store`` (allocated in host memory, slot = id): the tier
    keeps the store's rows as its host rows, and the store's ``weight`` / ``opt_state`` point
    at them, so saving and loading rows by id work on host memory (flush / reload the tier
    around them). On CUDA the rows are page-locked in place (no second copy of them)."""
    if store.world != 1:
        raise ValueError("a host tier holds the rows of a one-rank table")
    check_cache_fits(store.num_rows, store.dim, cache_budget, opt.state_width, device,
                     map_bytes=_map_bytes())  # fmt: skip
    if DEVICE_TIER:  # (the store's rows are the tier's host rows, adopted)
        return DeviceTier(
            store.weight, store.opt_state, device=device, opt=opt, kernels=opt.kernels,
            budget=budget_rows(store.num_rows, cache_budget),
            counts=None if counts is None else torch.as_tensor(counts), clock=clock,
        )  # fmt: skip
    tier = TieredRows(
        store.weight, store.opt_state, device=device, opt=opt, counts=counts, adopt=True,
        budget=budget_rows(store.num_rows, cache_budget), overlap=overlap, clock=clock,
    )  # fmt: skip
    store.weight = store.weight_full = tier.host_weight
    store.opt_state = store.opt_state_full = tier.host_state
    return tier


def _map_bytes() -> int:
    """Device bytes a one-rank tier spends per row of the table beside its cache (see
    :func:`check_cache_fits`)."""
    return 12 if DEVICE_TIER else 8


def check_cache_fits(
    num_rows: int, dim: int, cache_budget: float, state_width: int, device: torch.device,
    free: int | None = None, map_bytes: int = 8,
) -> None:  # fmt: skip
    """Refuse a device cache that cannot fit ``device`` (CUDA; ``free``: its free bytes,
    default asked of CUDA) before anything is allocated: the cache's rows and state and the
    device maps, ``map_bytes`` a row of the table (the host-decided tier's slot map: 8; the
    device-decided one's slot map, scratch map and access counts: 12)."""
    if device.type != "cuda" and free is None:
        return
    if free is None:
        free = int(torch.cuda.mem_get_info(device)[0])
    rows = budget_rows(num_rows, cache_budget)
    need = rows * 4 * (dim + state_width) + num_rows * map_bytes
    usable = max(0, int(free * SLACK) - RESERVE)
    if need > usable:
        gib = 2**30
        fits = max(0.0, (usable - num_rows * map_bytes) / (4 * (dim + state_width)) / num_rows)
        raise TableMemoryError(
            f"--cache-budget {cache_budget}: a device cache of {rows:,} of {num_rows:,} rows "
            f"needs {need / gib:.1f} GiB on {device}, which has {free / gib:.1f} GiB free "
            f"({usable / gib:.1f} GiB usable): take --cache-budget {fits:.3f} or less"
        )
