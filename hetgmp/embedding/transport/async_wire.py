"""Messages of the asynchronous transport (``--sync async``) as ZeroMQ multipart frames.

A message is ``[op, header, *arrays]``: ``op`` one of the byte strings below, ``header`` a
small JSON object (scalars, and the dtype and shape of every array frame, in order), then one
frame per array with its raw bytes. No pickle: a frame from the network is only ever read as
numbers. pyzmq is imported here and nowhere else in the package, lazily, so that ``--sync
collective`` never needs it (:func:`import_zmq` says how to install it).
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import numpy as np
import torch

READ, PUSH, CLOCK, REPLY = b"read", b"push", b"clock", b"reply"
DENSE = b"dense"  # a dense parameter shard's push-and-pull (hetgmp.train.dense_server)
OPS = (READ, PUSH, CLOCK, DENSE)
_DTYPES = {"int64": torch.int64, "float32": torch.float32}


def import_zmq() -> ModuleType:
    """pyzmq, or a clear error naming the extra that installs it."""
    try:
        import zmq
    except ImportError as err:
        raise RuntimeError(
            f"--sync async needs pyzmq ({err}); install it with `pip install pyzmq` or "
            "`pip install hetgmp[async]` (make install does)"
        ) from err
    return zmq


def pack(op: bytes, meta: dict[str, Any], arrays: dict[str, torch.Tensor]) -> list[bytes]:
    """``[op, header, *array bytes]`` (CPU tensors of the dtypes in ``_DTYPES``)."""
    specs, frames = [], []
    for name, t in arrays.items():
        t = t.detach().contiguous()
        specs.append([name, str(t.dtype).removeprefix("torch."), list(t.shape)])
        frames.append(t.numpy().tobytes())
    header = json.dumps({"meta": meta, "arrays": specs}).encode()
    return [op, header, *frames]


def unpack(frames: list[bytes]) -> tuple[bytes, dict[str, Any], dict[str, torch.Tensor]]:
    """The inverse of :func:`pack`; raises ``ValueError`` on a malformed message."""
    if len(frames) < 2:
        raise ValueError(f"async message with {len(frames)} frames (need op and header)")
    op = bytes(frames[0])
    head = json.loads(bytes(frames[1]))
    specs = head["arrays"]
    if len(specs) != len(frames) - 2:
        raise ValueError(f"async message names {len(specs)} arrays, carries {len(frames) - 2}")
    arrays = {}
    for (name, dtype, shape), raw in zip(specs, frames[2:], strict=True):
        if dtype not in _DTYPES:
            raise ValueError(f"async message array {name!r} has unsupported dtype {dtype!r}")
        buf = np.frombuffer(bytes(raw), dtype=dtype).copy()  # (writable, owned)
        arrays[name] = torch.from_numpy(buf).reshape(shape)
    return op, head["meta"], arrays


def nbytes(arrays: dict[str, torch.Tensor]) -> int:
    """Payload bytes of ``arrays`` (what the counters count; headers are not counted)."""
    return sum(t.numel() * t.element_size() for t in arrays.values())
