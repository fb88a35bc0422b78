"""Zero-copy views of host memory (:mod:`hetgmp.embedding.uva`): the DLPack view aliases its
host tensor (writes go both ways), keeps it alive, is released when the view goes, and refuses
what a GPU cannot reach; on a GPU (marked), kernels read and write pinned host rows in place."""

from __future__ import annotations

import gc

import pytest
import torch

from hetgmp.embedding import uva


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool]
)
def test_view_aliases_host_memory(dtype) -> None:
    host = (torch.arange(24).reshape(4, 6) % 3).to(dtype)
    view = uva.device_view(host, "cpu")
    assert view.data_ptr() == host.data_ptr() and view.dtype == dtype
    assert view.shape == host.shape and view.stride() == host.stride()
    assert torch.equal(view, host)
    view[2, 3] = 1
    host[0, 0] = 1
    assert bool(host[2, 3] == 1) and bool(view[0, 0] == 1)


def test_view_keeps_host_alive_and_is_released() -> None:
    before = len(uva._LIVE)
    host = torch.arange(10.0)
    view = uva.device_view(host[2:], "cpu")  # (a view with an offset, of a temporary)
    del host
    gc.collect()
    assert view.tolist() == [float(i) for i in range(2, 10)]
    assert len(uva._LIVE) == before + 1
    del view
    gc.collect()
    assert len(uva._LIVE) == before


def test_refusals() -> None:
    with pytest.raises(ValueError, match="page-locked"):
        uva.device_view(torch.zeros(3), "cuda")  # (checked before any CUDA call)
    with pytest.raises(ValueError, match="dtype"):
        uva.device_view(torch.zeros(3, dtype=torch.complex64), "cpu")
    with pytest.raises(ValueError, match="no meta views"):
        uva.device_view(torch.zeros(3), "meta")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_reads_and_writes_pinned_rows_in_place() -> None:
    from hetgmp.embedding.kernels import put_rows, take_rows

    host = torch.randn(1000, 64).pin_memory()
    rows = uva.device_view(host, "cuda")
    assert rows.device.type == "cuda" and rows.data_ptr() == host.data_ptr()
    idx = torch.randint(0, 1000, (300,), device="cuda")
    want = host.index_select(0, idx.cpu())
    assert torch.equal(rows.index_select(0, idx).cpu(), want)  # torch's kernel
    assert torch.equal(take_rows(rows, idx, backend="triton").cpu(), want)  # ours
    new = torch.randn(5, 64, device="cuda")
    at = torch.tensor([3, 10, 500, 999, 0], device="cuda")
    put_rows(rows, at, new, backend="triton")
    torch.cuda.synchronize()
    assert torch.equal(host[at.cpu()], new.cpu())  # written into host memory
