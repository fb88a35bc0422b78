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
import math
from types import ModuleType
from typing import Any

import numpy as np
import torch

from hetgmp.comm.rpc.schema import BadMessage, Schema
from hetgmp.comm.rpc.stage import HostStage, plain

REPLY = b"reply"  # every answer (a refusal is a reply whose header carries "error")
BYE = b"bye"  # a peer closes its sockets: waits for its answers fail at once (no answer)
_DTYPES = {"int64": torch.int64, "float32": torch.float32}
_NP = {torch.int64: np.int64, torch.float32: np.float32}
# what any message may be, before its operation's schema is asked (hetgmp.comm.rpc.schema)
MAX_OP_BYTES = 32
MAX_HEADER_BYTES = 1 << 16
MAX_ARRAYS = 16
MAX_NDIM = 4
MAX_DIM = 1 << 40
Spec = tuple[str, torch.dtype, tuple[int, ...]]  # an array's name, dtype and shape


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
    frames: list[Any], stage: HostStage, schema: Schema | None = None
) -> tuple[bytes, dict[str, Any], dict[str, torch.Tensor]]:
    """The inverse of :func:`pack`, the arrays on ``stage``'s device (laid out through its
    host buffers) once they fit ``schema`` (if given); raises :class:`~.schema.BadMessage` on
    a malformed message or one that breaks the schema."""
    op, meta, typed, raws = decode(frames)
    if schema is not None:
        schema.validate(meta, views(typed, raws))
    return op, meta, stage.receive(typed, raws)


def decode(frames: list[Any]) -> tuple[bytes, dict[str, Any], list[Spec], list[Any]]:
    """``(op, meta, specs, raw array frames)`` of a message whose frames are well formed: op
    and header, a JSON header within ``MAX_HEADER_BYTES`` naming at most ``MAX_ARRAYS``
    arrays of known dtypes and sane shapes, one frame of the right size per array. Anything
    else is a :class:`~.schema.BadMessage` (``malformed``), whatever the bytes were."""
    if len(frames) < 2:
        raise BadMessage(f"a message of {len(frames)} frames (need op and header)", "malformed")
    op, head = bytes(frames[0]), frames[1]
    if not 0 < len(op) <= MAX_OP_BYTES or len(head) > MAX_HEADER_BYTES:
        raise BadMessage(f"an op of {len(op)} bytes or a header of {len(head)}", "malformed")
    try:  # (any exception: deep nesting is a RecursionError, a huge number a ValueError...)
        parsed = json.loads(bytes(head), parse_constant=_no_constant)
        meta, specs = parsed["meta"], parsed["arrays"]
        if not isinstance(specs, list):  # (an empty object or string passed for no arrays)
            raise BadMessage("a header whose arrays are not a list", "malformed")
        typed = [_spec(s) for s in specs]
    except BadMessage:
        raise
    except Exception as err:  # noqa: BLE001 - every way a header can be wrong is one refusal
        raise BadMessage(f"an unreadable header ({type(err).__name__})", "malformed") from None
    if not isinstance(meta, dict) or len(typed) != len(frames) - 2:
        raise BadMessage(f"a header naming {len(typed)} arrays for {len(frames) - 2} frames",
                         "malformed")  # fmt: skip
    if len(typed) > MAX_ARRAYS or len({name for name, _, _ in typed}) != len(typed):
        raise BadMessage("too many arrays, or one named twice", "malformed")
    raws = frames[2:]
    for (name, dtype, shape), raw in zip(typed, raws, strict=True):
        want = math.prod(shape) * dtype.itemsize  # (Python ints: no overflow)
        if len(raw) != want:
            kind = str(dtype).removeprefix("torch.")
            raise BadMessage(f"array {name!r}: {len(raw)} bytes for {kind} {list(shape)}",
                             "malformed")  # fmt: skip
    return op, meta, typed, raws


def _no_constant(name: str) -> None:
    raise BadMessage(f"a header with {name}", "malformed")


def _spec(s: Any) -> Spec:
    """One array's ``[name, dtype, shape]`` of a header, checked."""
    if not isinstance(s, list):  # (a 3-letter string unpacks to three letters)
        raise BadMessage("an array spec that is not [name, dtype, shape]", "malformed")
    name, dtype, shape = s
    if not isinstance(name, str) or len(name) > 32 or dtype not in _DTYPES:
        raise BadMessage(f"an array named {str(name)[:32]!r} of dtype {str(dtype)[:16]!r}",
                         "malformed")  # fmt: skip
    if (
        not isinstance(shape, list) or len(shape) > MAX_NDIM
        or any(type(x) is not int or not 0 <= x <= MAX_DIM for x in shape)
        # (numpy and torch refuse a shape whose other sides overflow even with no values:
        # [0, 2**40, 2**40] passed the byte count and its view raised in the service)
        or math.prod(max(x, 1) for x in shape) > MAX_DIM
    ):  # fmt: skip
        raise BadMessage(f"array {name!r} has a bad shape", "malformed")
    return name, _DTYPES[dtype], tuple(shape)


def views(typed: list[Spec], raws: list[Any]) -> dict[str, np.ndarray]:
    """Numpy views of the arrays' received bytes (for checks: no copy, no torch call)."""
    return {
        name: np.frombuffer(raw, dtype=_NP[dtype]).reshape(shape)
        for (name, dtype, shape), raw in zip(typed, raws, strict=True)
    }


def nbytes(arrays: dict[str, torch.Tensor]) -> int:
    """Payload bytes of ``arrays`` (what the counters count; headers are not counted)."""
    return sum(t.numel() * t.element_size() for t in arrays.values())
