"""Shared fixtures: real-data location, free ports, tiny data sets."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
# One OpenMP thread for the test processes and every process they start (unless the caller
# set it): the suite runs two workers on a 2-core CI box, each starting ranks, and extra
# OpenMP threads only spin against each other there. Training picks its own torch threads
# (hetgmp.train.threads); this reaches the workers' own ops, numpy and the native partitioner.
os.environ.setdefault("OMP_NUM_THREADS", "1")
SHARED_DATASETS = Path(
    os.environ.get("HETGMP_SHARED_DATASETS", ROOT.parent / "shared" / "datasets")
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def _float32_matmul_precision_restored():
    """A test that trains in-process sets torch's global TF32 switches (``--matmul_precision``
    is a process setting); later tests comparing CUDA against CPU at fp32 tolerances must not
    inherit them."""
    import sys

    torch = sys.modules.get("torch")
    before = None if torch is None else torch.get_float32_matmul_precision()
    cudnn = None if torch is None else torch.backends.cudnn.allow_tf32
    yield
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_float32_matmul_precision(before or "highest")
        torch.backends.cudnn.allow_tf32 = True if cudnn is None else cudnn


@pytest.fixture
def shared_datasets() -> Path:
    """``../shared/datasets`` (real samples, read in place); skip when it is absent."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"real data samples not found at {SHARED_DATASETS}")
    return SHARED_DATASETS


@pytest.fixture
def tiny_dataset(tmp_path: Path):
    """A small random dataset directory: 3 fields, 2 dense features, 400 train / 100 test."""
    from hetgmp.data.format import make_fields, write_dataset

    rng = np.random.default_rng(0)
    cards = [7, 50, 13]
    fields = make_fields(["a", "b", "c"], cards)
    offs = np.array([f.offset for f in fields])

    def split(n: int):
        local = np.stack([rng.integers(0, c, n) for c in cards], axis=1)
        dense = rng.random((n, 2), dtype=np.float32)
        return local + offs, dense, (rng.random(n) < 0.3).astype(np.float32)

    return write_dataset(
        tmp_path / "tiny", fields, {"train": split(400), "test": split(100)}, num_dense=2
    )


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ARG001 - pytest's hook
    """Tests marked ``slow`` (scale runs, ``pytest -m slow``) or ``gpu`` (whole training runs
    on the device machine) get 900 s unless they set their own timeout; the default per test
    is 60 s (pyproject.toml)."""
    for item in items:
        long = item.get_closest_marker("slow") or item.get_closest_marker("gpu")
        if long and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(900))
