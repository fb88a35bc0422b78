"""What a message of each operation may carry (:class:`Schema`), checked before any handler
sees it: the one validation layer of the RPC service (:mod:`.service`) and of the answers its
requesters take (:mod:`.peers`).

Anything on the network may send anything: a truncated message, a header of another shape,
an array of ten billion rows, NaN gradients, ids outside the table, counts that do not add up.
:func:`hetgmp.comm.rpc.wire.decode` checks the frames themselves (count, header, dtypes,
sizes); a :class:`Schema` checks one operation's header fields (type and range), its arrays
(dtype, rank, length, value range, finite values) and, through ``check``, what ties them
together (counts per id, ...). The arrays are looked at as numpy views of the received bytes,
on the host, before they are copied anywhere (no device work, no torch call). A violation is a
:class:`BadMessage` whose ``reason`` names the counter it goes to: the service answers it with
a refusal and counts it, and never lets it reach a handler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

BIG = 2**62  # the largest counter a message may carry (clocks, versions, samples)
# the reasons a message is refused, each a counter (RpcService.refused): its frames or header
# (malformed), its operation (unknown), its schema (invalid, nonfinite), its handler
# (refused: e.g. a row the rank does not own), a client the CURVE handshake turned away (auth)
REASONS = ("malformed", "unknown", "invalid", "nonfinite", "refused", "auth")


class BadMessage(ValueError):
    """A message refused before its handler; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Field:
    """A header scalar: an ``int`` in ``[lo, hi]`` other than ``exclude``, or a ``bool``
    (``kind``)."""

    kind: type = int
    lo: int = 0
    hi: int = BIG
    required: bool = True
    exclude: int | None = None

    def check(self, name: str, value: Any) -> None:
        if self.kind is bool:
            if not isinstance(value, bool):
                raise BadMessage(f"header field {name!r} must be true or false")
            return
        # (bool is an int in Python; a JSON float or string is not a count)
        if type(value) is not int or not self.lo <= value <= self.hi or value == self.exclude:
            but = f" other than {self.exclude}" if self.exclude is not None else ""
            raise BadMessage(
                f"header field {name!r} must be an integer in [{self.lo}, {self.hi}]{but}"
            )


@dataclasses.dataclass(frozen=True)
class Array:
    """An array: ``dtype`` (``"int64"`` / ``"float32"``), its rank (``ndim``, any of them),
    at most ``max_len`` rows, int values within ``[lo, hi]`` (``outside``: what a value out
    of it is, for the refusal), float values finite."""

    dtype: str
    ndim: tuple[int, ...] = (1,)
    max_len: int = BIG
    lo: int | None = None
    hi: int | None = None
    required: bool = True
    outside: str = ""

    def check(self, name: str, a: np.ndarray) -> None:
        if str(a.dtype) != self.dtype or a.ndim not in self.ndim:
            raise BadMessage(f"array {name!r} must be {self.dtype} of rank {self.ndim}")
        if a.ndim and a.shape[0] > self.max_len:
            raise BadMessage(f"array {name!r} has {a.shape[0]} rows, at most {self.max_len}")
        if not a.size:
            return
        if a.dtype.kind == "f":
            if not np.isfinite(a).all():
                raise BadMessage(f"array {name!r} holds non-finite values", "nonfinite")
        elif (self.lo is not None and a.min() < self.lo) or (
            self.hi is not None and a.max() > self.hi
        ):
            raise BadMessage(f"array {name!r} names {self.outside}" if self.outside else
                             f"array {name!r} holds values outside [{self.lo}, {self.hi}]")  # fmt: skip


# check(meta, arrays): what ties the fields and arrays together; raises BadMessage
Check = Callable[[dict[str, Any], dict[str, np.ndarray]], None]


@dataclasses.dataclass(frozen=True)
class Schema:
    """One operation's messages: header ``meta`` fields, ``arrays`` and a ``check`` of both
    together. Nothing else is allowed (an unknown field or array is refused)."""

    meta: Mapping[str, Field] = dataclasses.field(default_factory=dict)
    arrays: Mapping[str, Array] = dataclasses.field(default_factory=dict)
    check: Check | None = None

    def validate(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Raise :class:`BadMessage` unless ``meta`` and ``arrays`` fit this schema."""
        for part, given, declared in (("header field", meta, self.meta),
                                      ("array", arrays, self.arrays)):  # fmt: skip
            extra = sorted(set(given) - set(declared))
            if extra:
                raise BadMessage(f"unexpected {part} {extra[0]!r}")
            for name, spec in declared.items():
                if name in given:
                    spec.check(name, given[name])
                elif spec.required:
                    raise BadMessage(f"missing {part} {name!r}")
        if self.check is not None:
            self.check(meta, arrays)


def together(arrays: dict[str, np.ndarray], names: tuple[str, ...]) -> bool:
    """Whether ``arrays`` carries all of ``names`` (True) or none (False); refused otherwise."""
    have = [n in arrays for n in names]
    if any(have) and not all(have):
        raise BadMessage(f"arrays {list(names)} come together or not at all")
    return all(have)


def same_len(arrays: dict[str, np.ndarray], what: str, *names: str) -> int:
    """The common row count of ``names`` (refused when they differ)."""
    lens = [arrays[n].shape[0] for n in names]
    if len(set(lens)) > 1:
        raise BadMessage(
            f"{what}: " + ", ".join(f"{n} {k}" for n, k in zip(names, lens, strict=True))
        )
    return lens[0]
