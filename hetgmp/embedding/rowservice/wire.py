"""The row service's messages: its three operations on a rank's RPC service, and which array
of them counts as which bytes in the table's counters.

The frames themselves (``[op, JSON header, raw arrays]``, no pickle) are
:mod:`hetgmp.comm.rpc.wire`'s; :func:`pack`, :func:`unpack` and :func:`nbytes` are re-exported
here so that the row service's modules name one wire module.
"""

from __future__ import annotations

from hetgmp.comm.rpc.wire import nbytes, pack, unpack

__all__ = ["CLOCK", "KINDS", "KIND_OF", "OPS", "PUSH", "READ", "nbytes", "pack", "unpack"]

READ = b"read"  # mirror queries and rows not stored at the reader -> lags, values (answered)
PUSH = b"push"  # gradients of rows the receiver owns -> buffered, acknowledged
CLOCK = b"clock"  # a peer's clock, samples taken and meetings (one-way)
OPS = (READ, PUSH, CLOCK)

KINDS = ("ids", "versions", "values", "gradients")  # the byte counters' kinds
# every array a request or reply carries, by counter kind (the lags count as versions)
KIND_OF = {
    "mids": "ids", "rids": "ids", "ids": "ids", "mver": "versions", "cnt": "versions",
    "grad": "gradients", "lag": "versions", "values": "values", "versions": "versions",
    "state": "values",
}  # fmt: skip
