"""Messages of a rank's RPC service (:mod:`hetgmp.comm.rpc`) as ZeroMQ multipart frames.

A message is ``[op, header, *arrays]``: ``op`` a short byte string naming the operation (each
layer defines its own and registers a handler for it, :meth:`.service.RpcService.register`;
this module defines only the service's own: :data:`REPLY` and :data:`BYE`), ``header`` a small
JSON object (scalars, and the dtype and shape of every array frame, in order), then one frame
per array with its raw bytes. No pickle: a frame from the network is only ever read as
numbers. Arrays are sent from host memory and received into the device's through
:class:`~.stage.HostStage` (pinned buffers on CUDA). pyzmq is imported here and nowhere else
in the package, lazily, so that ``--sync collective`` never needs it (:func:`import_zmq` says
how to install it).
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import numpy as np
import torch

from hetgmp.comm.rpc.stage import HostStage, plain

REPLY = b"reply"  # every answer (a refusal is a reply whose header carries "error")
BYE = b"bye"  # a peer closes its sockets: waits for its answers fail at once (no answer)
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


def pack(op: bytes, meta: dict[str, Any], arrays: dict[str, torch.Tensor]) -> list[Any]:
    """``[op, header, *array bytes]`` (host tensors of the dtypes in ``_DTYPES``; on CUDA what
    :meth:`.stage.HostStage.to_host` gives). The array frames are views of the tensors'
    memory: send them at once (ZeroMQ's copying send copies them into the message)."""
    specs, frames = [], []
    for name, t in arrays.items():
        t = plain(t)
        if t.device.type != "cpu" or _DTYPES.get(str(t.dtype).removeprefix("torch.")) is None:
            raise ValueError(f"async message array {name!r}: {t.dtype} on {t.device} (host "
                             f"tensors of {sorted(_DTYPES)} only)")  # fmt: skip
        specs.append([name, str(t.dtype).removeprefix("torch."), list(t.shape)])
        frames.append(t.numpy().reshape(-1).view(np.uint8).data)
    header = json.dumps({"meta": meta, "arrays": specs}).encode()
    return [op, header, *frames]


def unpack(
    frames: list[Any], stage: HostStage
) -> tuple[bytes, dict[str, Any], dict[str, torch.Tensor]]:
    """The inverse of :func:`pack`, the arrays on ``stage``'s device (laid out through its
    host buffers); raises ``ValueError`` on a malformed message."""
    if len(frames) < 2:
        raise ValueError(f"async message with {len(frames)} frames (need op and header)")
    op = bytes(frames[0])
    head = json.loads(bytes(frames[1]))
    specs = head["arrays"]
    if len(specs) != len(frames) - 2:
        raise ValueError(f"async message names {len(specs)} arrays, carries {len(frames) - 2}")
    typed = []
    for (name, dtype, shape), raw in zip(specs, frames[2:], strict=True):
        if dtype not in _DTYPES:
            raise ValueError(f"async message array {name!r} has unsupported dtype {dtype!r}")
        shape = tuple(int(x) for x in shape)
        want = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype].itemsize
        if min(shape, default=0) < 0 or len(raw) != want:
            raise ValueError(
                f"async message array {name!r}: {len(raw)} bytes for {dtype} {list(shape)}"
            )
        typed.append((str(name), _DTYPES[dtype], shape))
    return op, head["meta"], stage.receive(typed, frames[2:])


def nbytes(arrays: dict[str, torch.Tensor]) -> int:
    """Payload bytes of ``arrays`` (what the counters count; headers are not counted)."""
    return sum(t.numel() * t.element_size() for t in arrays.values())
