"""Choose how a rank's batches reach the device: resident, prefetched by a thread, or plain.

``--data-on-device auto|on|off`` and ``--device-data-budget-gb`` pick :class:`ResidentSource`
(the samples on the device; auto: on CUDA when they fit the budget, by default a quarter of the
device's free memory); otherwise ``--prefetch-batches N`` > 0 picks :class:`ThreadSource` and 0
the plain :class:`SyncSource`. All three yield the same batches in the same order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Protocol

import torch

from hetgmp.choices import DATA_ON_DEVICE  # (--help shows them without torch)
from hetgmp.data.device_batches import (
    INT32_MAX,
    DeviceBatch,
    EpochPlan,
    PendingBatch,
    ResidentSource,
    Slot,
    SyncSource,
    resident_bytes,
)
from hetgmp.data.prefetch import ThreadSource

AUTO_BUDGET_SHARE = 0.25  # of the device's free memory, when no budget is given


class BatchSource(Protocol):
    """What the trainer reads: one (slot, batch or None) per global step."""

    name: str

    def next(self) -> tuple[Slot, DeviceBatch | PendingBatch | None]: ...

    def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """The data-path options of a run (from :class:`hetgmp.train.config.TrainConfig`)."""

    data_on_device: str = "auto"
    budget_gb: float = 0.0  # 0: AUTO_BUDGET_SHARE of free device memory
    prefetch_batches: int = 0


def device_budget(device: torch.device, budget_gb: float) -> int:
    """Bytes of device memory resident samples may take."""
    if budget_gb > 0:
        return int(budget_gb * 2**30)
    if device.type != "cuda":
        raise ValueError("an automatic device-data budget needs a CUDA device")
    free, _total = torch.cuda.mem_get_info(device)
    return int(free * AUTO_BUDGET_SHARE)


def wants_resident(
    opts: PipelineOptions, plan: EpochPlan, device: torch.device, ids_int32: bool
) -> tuple[bool, str]:
    """Whether to hold the samples on the device, and why (for the log)."""
    if opts.data_on_device not in DATA_ON_DEVICE:
        raise ValueError(f"--data-on-device {opts.data_on_device!r}: expected {DATA_ON_DEVICE}")
    if opts.data_on_device != "auto":
        return opts.data_on_device == "on", f"--data-on-device {opts.data_on_device}"
    if device.type != "cuda":
        return False, "--data-on-device auto on CPU"
    need = resident_bytes(plan.split, int(plan.indices.size), ids_int32)
    budget = device_budget(device, opts.budget_gb)
    verdict = "fit" if need <= budget else "exceed"
    why = f"{need / 2**20:.0f} MiB {verdict} the budget of {budget / 2**20:.0f} MiB"
    return need <= budget, why


def open_source(
    plan: EpochPlan,
    slots: Iterator[Slot],
    device: torch.device,
    opts: PipelineOptions,
    *,
    num_rows: int,
    pad_from: int | None = None,
    others_fit: Callable[[bool], bool] | None = None,
) -> tuple[BatchSource, str]:
    """The batch source for ``slots`` and a sentence for the log saying which and why
    (``pad_from``: the first id column that may hold a multi-hot bag's padding;
    ``others_fit``: collective, whether every rank's samples fit too, given this rank's
    verdict: ranks whose steps differ by residency would not meet at the same collectives)."""
    ids_int32 = num_rows - 1 <= INT32_MAX
    resident, why = wants_resident(opts, plan, device, ids_int32)
    if others_fit is not None and not others_fit(resident):
        resident, why = False, f"{why}; another rank's samples do not fit theirs"
    if resident:
        src = ResidentSource(
            plan, slots, device, ids_int32=ids_int32, num_rows=num_rows, pad_from=pad_from
        )
        width = "int32" if ids_int32 else "int64"
        return (
            src,
            f"samples resident on {device} ({src.nbytes / 2**20:.1f} MiB, ids {width}; {why})",
        )
    if opts.prefetch_batches > 0:
        thread = ThreadSource(plan, slots, device, depth=opts.prefetch_batches)
        pinned = ", pinned buffers, side stream" if device.type == "cuda" else ""
        return thread, f"background reader {opts.prefetch_batches} batches ahead{pinned} ({why})"
    return SyncSource(plan, slots, device), f"batches gathered in the training thread ({why})"
