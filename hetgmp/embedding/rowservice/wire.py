"""The row service's messages: its three operations on a rank's RPC service, what each may
carry (:func:`schemas`, and :func:`read_reply` for an owner's answer to a read: checked before
any handler or reader sees them, :mod:`hetgmp.comm.rpc.schema`), and which array of them
counts as which bytes in the table's counters.

The frames themselves (``[op, JSON header, raw arrays]``, no pickle) are
:mod:`hetgmp.comm.rpc.wire`'s; :func:`pack`, :func:`unpack` and :func:`nbytes` are re-exported
here so that the row service's modules name one wire module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hetgmp.comm.rpc.schema import BIG, Array, BadMessage, Field, Schema, same_len, together
from hetgmp.comm.rpc.wire import nbytes, pack, unpack
from hetgmp.embedding.protocol import beyond_bound

__all__ = [
    "CLOCK", "KINDS", "KIND_OF", "OPS", "PUSH", "READ", "nbytes", "pack", "read_reply",
    "schemas", "unpack",
]  # fmt: skip

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

MAX_COUNT = 2**40  # the most occurrences one pushed row may count (a version step)


def schemas(
    num_rows: int, n_own: int, dim: int, peer: Callable[[bool], Field]
) -> dict[bytes, Schema]:
    """The three operations' messages at an owner of ``n_own`` of the table's ``num_rows``
    rows of width ``dim`` (``peer(required)``: a header field naming another rank). A request
    names each row at most once per array, so no array is longer than ``n_own``; ids lie in
    the table (the owner checks it owns them), versions and clocks are counts, gradients
    finite values, one row of ``dim`` per pushed id."""
    ids = Array("int64", max_len=n_own, lo=0, hi=num_rows - 1, required=False,
                outside=f"a row id outside the table [0, {num_rows})")  # fmt: skip
    tick = {"rank": peer(False), "clock": Field(required=False), "samples": Field(required=False)}
    push = {
        "ids": ids, "cnt": Array("int64", max_len=n_own, lo=0, hi=MAX_COUNT, required=False),
        "grad": Array("float32", ndim=(1, 2), max_len=n_own * max(dim, 1), required=False),
    }  # fmt: skip

    def pushed(meta: dict[str, Any], a: dict[str, np.ndarray], alone: bool) -> None:
        if "clock" in meta and "rank" not in meta:
            raise BadMessage("a clock without the rank it is of")
        if not together(a, ("ids", "cnt", "grad")):
            if alone:
                raise BadMessage("a push without ids, counts and gradients")
            return
        if not alone and "clock" not in meta:  # (a read carries one only with the clock)
            raise BadMessage("a push riding on a read without the sender's clock")
        n = same_len(a, "a push's ids and counts", "ids", "cnt")
        g = a["grad"]
        if g.size != n * dim or (g.ndim == 2 and g.shape[1] != dim):
            raise BadMessage(f"a push of {n} rows carries {g.size} gradient values "
                             f"({dim} per row)")  # fmt: skip

    def read(meta: dict[str, Any], a: dict[str, np.ndarray]) -> None:
        if a["mver"].shape != a["mids"].shape:
            raise BadMessage(f"a read carries {a['mver'].size} versions for "
                             f"{a['mids'].size} mirror ids")  # fmt: skip
        pushed(meta, a, alone=False)

    return {
        READ: Schema(
            {"bound": Field(), "send_all": Field(bool), **tick},
            {
                "mids": dataclasses.replace(ids, required=True),
                "mver": Array("int64", max_len=n_own, lo=0, hi=BIG),
                "rids": dataclasses.replace(ids, required=True),
                **push,
            },
            read,
        ),  # fmt: skip
        PUSH: Schema(tick, push, lambda m, a: pushed(m, a, alone=True)),
        CLOCK: Schema(
            {
                "rank": peer(True),
                "clock": Field(),
                "samples": Field(required=False),
                "meet": Field(required=False),
            }
        ),  # fmt: skip
    }


def read_reply(nqm: int, nqr: int, dim: int, state: bool, bound: int, send_all: bool) -> Schema:
    """An owner's answer to a read of ``nqm`` mirrors and ``nqr`` rows not stored here: a lag
    per mirror, then a value (version, state) for every mirror beyond ``bound`` (every one
    with ``send_all``) and every row; the reader picks the refreshed mirrors by that count,
    so it must be the one the lags say."""

    def check(meta: dict[str, Any], a: dict[str, np.ndarray]) -> None:
        k = nqm if send_all else int(beyond_bound(torch.from_numpy(a["lag"]), bound).sum())
        if a["lag"].shape[0] != nqm:
            raise BadMessage(f"{a['lag'].shape[0]} lags for {nqm} mirrors")
        want = k + nqr
        names = ("values", "versions", "state") if state else ("values", "versions")
        if same_len(a, "an answer's values, versions (state)", *names) != want:
            raise BadMessage(f"{a['values'].shape[0]} values for {k} mirrors beyond the bound "
                             f"and {nqr} rows")  # fmt: skip
        if a["values"].ndim != 2 or a["values"].shape[1] != dim:
            raise BadMessage(f"values of width {a['values'].shape[1:]}, not {dim}")

    return Schema(
        {},
        {"lag": Array("int64", max_len=nqm, lo=-BIG, hi=BIG),
         "values": Array("float32", ndim=(2,), max_len=nqm + nqr),
         "versions": Array("int64", max_len=nqm + nqr, lo=0, hi=BIG),
         "state": Array("float32", ndim=(1, 2), max_len=nqm + nqr, required=state)},
        check,
    )  # fmt: skip
