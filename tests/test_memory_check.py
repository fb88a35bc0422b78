"""The table's memory check: a rank whose rows cannot fit its GPU stops before allocating
them, saying how much it needs, how much there is, and how many GPUs with a plan would do."""

from __future__ import annotations

import re

import pytest
import torch

from hetgmp.embedding.memory import TableMemoryError, check_fits, table_bytes

GIB = 2**30


def test_table_bytes_counts_rows_state_mirrors_and_maps() -> None:
    # 1M rows of 128 float32 + Adagrad state (1) + version (8 B) per stored row, 1k mirrors
    got = table_bytes(2_000_000, 128, 1_000_000, 1_000, 1)
    rows = 1_000_001 * (512 + 8 + 4)
    mirrors = 1_001 * (2 * 512 + 8)
    maps = 2_000_000 * 12 + 1_000_000 * 8
    assert got == rows + mirrors + maps
    # (several ranks: the plan's leader and count maps, the epoch scan's stamps and counts)
    several = table_bytes(2_000_000, 128, 1_000_000, 1_000, 1, ranks=2)
    assert several == got + 2_000_000 * 12


def test_a_table_that_fits_passes_and_cpu_is_not_checked() -> None:
    check_fits(10**6, 128, 10**6, 0, 1, rank=0, world=1, device=torch.device("cuda"),
               free=80 * GIB)  # fmt: skip
    check_fits(10**9, 128, 10**9, 0, 1, rank=0, world=1, device=torch.device("cpu"))


def test_a_table_larger_than_the_gpu_stops_with_what_to_do() -> None:
    rows = 200_000_000  # 200M x 128 float32: ~96 GiB with state, versions and maps
    with pytest.raises(TableMemoryError) as err:
        check_fits(rows, 128, rows, 0, 1, rank=0, world=1, device=torch.device("cuda"),
                   free=79 * GIB)  # fmt: skip
    msg = str(err.value)
    need = float(re.search(r"need ([\d.]+) GiB", msg).group(1))
    assert need > 90 and "79.0 GiB free" in msg
    gpus = int(re.search(r"partition\.py -n (\d+)", msg).group(1))
    # the fewest that fit: 2 (the rows split in two with mirrors and maps: ~57 GiB each)
    assert gpus == 2 and f"mpirun -np {gpus}" in msg and "--partition part.npz" in msg
    # the suggestion fits: the rows split over that many GPUs stay under the usable share
    per_gpu = float(re.search(r"about ([\d.]+) GiB of rows per GPU", msg).group(1))
    assert per_gpu * GIB < 79 * GIB * 0.9 - 2 * GIB
