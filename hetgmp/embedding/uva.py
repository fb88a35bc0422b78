"""Zero-copy views of host memory for the GPU (issue 33: rows in host memory, gathered by the
GPU itself).

Why: a host tier's missed rows must reach the device every step without the host deciding
anything (a host decision per step cost ~7.5 ms against a ~0.6 ms step). With unified virtual
addressing (every 64-bit CUDA process), page-locked host memory has one address for the host
and the device, so a kernel can read and write it directly over PCIe / NVLink-C2C: a gather of
the missed rows is then one kernel launch with device-side indices, which a CUDA graph can hold.
torch has no public way to wrap such an address as a CUDA tensor, so :func:`device_view`
builds one through DLPack (the capsule torch imports without copying).

The memory must be page-locked (``Tensor.pin_memory()``, or ``cudaHostRegister`` with the mapped
flag: :func:`register_mapped`); the view keeps its host tensor alive. Reading it from a kernel
moves bytes over the bus at every access: use it for rows read once per step, never as the
working copy of hot rows (those belong in a device cache).
"""

from __future__ import annotations

import ctypes
import threading

import torch

DLPACK_DEVICE = {"cpu": 1, "cuda": 2}  # kDLCPU, kDLCUDA
# (code, bits): kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6
DLPACK_DTYPE = {
    torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16),
    torch.float64: (2, 64), torch.int64: (0, 64), torch.int32: (0, 32), torch.int16: (0, 16),
    torch.int8: (0, 8), torch.uint8: (1, 8), torch.bool: (6, 8),
}  # fmt: skip
HOST_REGISTER_MAPPED = 2  # cudaHostRegisterMapped


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
        ("dtype", _DType), ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
    ]  # fmt: skip


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                     ("deleter", _DELETER)]  # fmt: skip

# what each view's capsule points into, alive until torch calls the deleter (keyed by the
# managed struct's address)
_LIVE: dict[int, tuple[object, ...]] = {}
_LOCK = threading.Lock()


@_DELETER
def _release(managed: ctypes.POINTER(_Managed)) -> None:  # type: ignore[valid-type]
    with _LOCK:
        _LIVE.pop(ctypes.addressof(managed.contents), None)


def _capsule(host: torch.Tensor, device: torch.device) -> object:
    code, bits = DLPACK_DTYPE[host.dtype]
    shape = (ctypes.c_int64 * max(host.dim(), 1))(*host.shape)
    strides = (ctypes.c_int64 * max(host.dim(), 1))(*host.stride())
    m = _Managed()
    m.dl_tensor = _Tensor(
        host.data_ptr(), _Device(DLPACK_DEVICE[device.type], device.index or 0), host.dim(),
        _DType(code, bits, 1), shape, strides, 0,
    )  # fmt: skip
    m.manager_ctx = None
    m.deleter = _release
    with _LOCK:
        _LIVE[ctypes.addressof(m)] = (m, shape, strides, host)
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = (
        ctypes.py_object,
        [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p],
    )
    return new(ctypes.addressof(m), b"dltensor", None)


def device_view(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A tensor on ``device`` that aliases ``host``'s memory (no copy; ``host`` is kept alive
    while the view lives). CUDA: ``host`` must be page-locked (:meth:`torch.Tensor.pin_memory`
    or :func:`register_mapped`); kernels then read and write host memory directly. CPU: the
    same tensor's memory under a second name (what the tests of this module check)."""
    device = torch.device(device)
    if host.device.type != "cpu":
        raise ValueError(f"device_view needs a host tensor, got one on {host.device}")
    if device.type not in DLPACK_DEVICE:
        raise ValueError(f"device_view: no {device.type} views (cpu or cuda)")
    if host.dtype not in DLPACK_DTYPE:
        raise ValueError(f"device_view: dtype {host.dtype} is not supported")
    if device.type == "cuda" and not host.is_pinned():
        raise ValueError(
            "device_view: the host tensor is not page-locked: a GPU can only reach pinned "
            "memory (use .pin_memory(), or hetgmp.embedding.uva.register_mapped in place)"
        )
    return torch.from_dlpack(_capsule(host, device))


def register_mapped(t: torch.Tensor) -> bool:
    """Page-lock ``t``'s own memory, mapped into the devices' address space
    (``cudaHostRegister(..., cudaHostRegisterMapped)``), so :func:`device_view` may wrap it
    without a pinned copy (a table larger than the host's free memory has no room for one).
    True when done; undo with ``torch.cuda.cudart().cudaHostUnregister(t.data_ptr())``."""
    if not t.numel() or not t.is_contiguous() or not torch.cuda.is_available():
        return False
    nbytes = t.numel() * t.element_size()
    err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, HOST_REGISTER_MAPPED)
    return int(err) == 0
