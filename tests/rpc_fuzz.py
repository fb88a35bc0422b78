"""A seeded generator of bad messages for a rank's RPC service (tests/test_rpc_fuzz.py, issue
31): random frames, unknown operations, and well-formed requests of every registered operation
(``read``, ``push``, ``clock``, ``bye``, ``dense``) broken in exactly one way the generator
picked, so it knows which refusal counter (:data:`hetgmp.comm.rpc.schema.REASONS`) each one
must land in.

No message it makes may change training: every one is refused before its handler runs, except
the ``refused`` ones, pushes of rows the target does not own, which its handler refuses before
it buffers anything. (A valid read would drain the owner's buffered pushes at a moment of the
stranger's choosing, a valid clock or goodbye would move the protocol: none is made.)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import numpy as np

BIG = 2**62  # (hetgmp.comm.rpc.schema.BIG: the largest count a header or array may carry)
MAX_COUNT = 2**40  # (the rowservice wire's largest count per pushed row)
Msg = tuple[str, list[bytes]]  # (the refusal reason it must get, its frames)
# arrays whose length another array (or the dense shard) fixes: "rids" stands alone
PARTNERED = ("mids", "mver", "ids", "cnt", "grad", "delta")
# shapes of no values whose other sides no array may have (numpy and torch refuse them)
HUGE_EMPTY = ([0, 2**40, 2**40], [2**40, 0, 2**40, 2**40])
Base = tuple[bytes, dict[str, Any], dict[str, np.ndarray], tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class Target:
    """The service fuzzed: its rank, the job's size, the table (``rows`` of width ``dim``),
    the rows it does not own (``foreign``) and its dense shard's length."""

    rank: int
    world: int
    rows: int
    dim: int
    foreign: np.ndarray
    dense: int


def frames(op: bytes, meta: Any, arrays: dict[str, np.ndarray], specs: Any = None) -> list[bytes]:
    """``[op, header, *array bytes]`` as the wire lays it out (``specs``: another header's
    array list, for frame-level damage)."""
    if specs is None:
        specs = [[k, str(a.dtype), list(a.shape)] for k, a in arrays.items()]
    head = json.dumps({"meta": meta, "arrays": specs}).encode()
    return [op, head, *(a.tobytes() for a in arrays.values())]


def nested(depth: int) -> Any:
    """A JSON value ``depth`` lists deep."""
    v: Any = 0
    for _ in range(depth):
        v = [v]
    return v


class Fuzzer:
    """``Fuzzer(seed, target).messages(n)``: ``n`` bad messages, each with its reason."""

    def __init__(self, seed: int, target: Target) -> None:
        self.rng = np.random.default_rng(seed)
        self.t = target
        self.makers: list[tuple[float, Callable[[], Msg]]] = [
            (0.10, self.garbage), (0.22, self.bad_frames), (0.05, self.unknown),
            (0.23, self.bad_header), (0.35, self.bad_array), (0.05, self.not_owned),
        ]  # fmt: skip

    def messages(self, n: int) -> list[Msg]:
        p = np.array([w for w, _ in self.makers])
        picks = self.rng.choice(len(self.makers), n, p=p / p.sum())
        return [self.makers[i][1]() for i in picks]

    # ------------------------------------------------------------------ pieces
    def pick(self, seq: Any) -> Any:
        return seq[int(self.rng.integers(len(seq)))]

    def ids(self, lo: int = 1) -> np.ndarray:
        """Distinct rows the target does not own (a mutation that fails to refuse a message
        still never touches its rows: the handler refuses them)."""
        k = int(self.rng.integers(lo, min(6, len(self.t.foreign)) + 1))
        return self.rng.choice(self.t.foreign, k, replace=False).astype(np.int64)

    def peer(self) -> int:
        return self.pick([r for r in range(self.t.world) if r != self.t.rank])

    def push_arrays(self) -> dict[str, np.ndarray]:
        ids = self.ids()
        grad = self.rng.standard_normal((len(ids), self.t.dim)).astype(np.float32)
        if self.rng.random() < 0.5:
            grad = grad.reshape(-1)  # (a push may carry its gradients flat)
        return {"ids": ids, "cnt": self.rng.integers(1, 5, len(ids)).astype(np.int64),
                "grad": grad}  # fmt: skip

    def base(self) -> Base:
        """A well-formed request of a registered operation, and the header fields and arrays
        whose absence alone makes it invalid."""
        kind = self.pick(["read", "read_step", "push", "push_step", "clock", "bye", "dense"])
        tick = {"rank": self.peer(), "clock": int(self.rng.integers(0, 100))}
        if kind.startswith("read"):
            mids = self.ids()
            meta = {
                "bound": int(self.rng.integers(0, 5)),
                "send_all": bool(self.rng.random() < 0.5),
            }
            arrays = {"mids": mids, "mver": self.rng.integers(0, 9, len(mids)).astype(np.int64),
                      "rids": self.ids(lo=0)}  # fmt: skip
            if kind == "read":
                return b"read", meta, arrays, ("bound", "send_all", "mids", "mver", "rids")
            return b"read", {**meta, **tick}, {**arrays, **self.push_arrays()}, (
                "bound", "send_all", "rank", "clock", "mids", "mver", "rids", "ids", "cnt", "grad")  # fmt: skip
        if kind == "push":
            return b"push", {}, self.push_arrays(), ("ids", "cnt", "grad")
        if kind == "push_step":
            return b"push", tick, self.push_arrays(), ("rank", "ids", "cnt", "grad")
        if kind == "clock":
            meta = {**tick, "samples": int(self.rng.integers(0, 999))}
            return b"clock", meta, {}, ("rank", "clock")
        if kind == "bye":
            return b"bye", {"rank": tick["rank"]}, {}, ("rank",)
        delta = self.rng.standard_normal(self.t.dense).astype(np.float32)
        return b"dense", {}, {"delta": delta}, ("delta",)

    # ------------------------------------------------------------------ the makers
    def garbage(self) -> Msg:
        """1 to 20 frames of random bytes (an op of 1-32 bytes: nothing JSON can read)."""
        n = int(self.rng.integers(1, 21))
        out = [self.rng.bytes(int(self.rng.integers(0, 300))) for _ in range(n)]
        if n > 1 and self.rng.random() < 0.5:
            out[1] = b"\xff" + out[1]  # (not UTF-8 either)
        return "malformed", out

    def unknown(self) -> Msg:
        """A well-formed message of an operation nobody registered."""
        op = self.pick([b"exec", b"reply", b"claim", b"READ", b"read ", b"x" * 32,
                        bytes(self.rng.integers(128, 256, 8).astype(np.uint8))])  # fmt: skip
        _, meta, arrays, _ = self.base()
        return "unknown", frames(op, meta, arrays)

    def not_owned(self) -> Msg:
        """A valid push of rows the target does not own: its handler refuses it."""
        return "refused", frames(b"push", {}, self.push_arrays())

    def bad_frames(self) -> Msg:
        """A request broken at the frame level: count, sizes, header syntax, array specs."""
        op, meta, arrays, _ = self.base()
        specs = [[k, str(a.dtype), list(a.shape)] for k, a in arrays.items()]
        raw = frames(op, meta, arrays)
        how = int(self.rng.integers(12))
        if how == 0:  # (the op and header only, or the op alone)
            return "malformed", raw[: int(self.rng.integers(1, 2 + bool(arrays)))]
        if how == 1:  # (one frame too many, or one array frame short)
            if arrays and self.rng.random() < 0.5:
                return "malformed", raw[:-1]
            return "malformed", [*raw, self.rng.bytes(int(self.rng.integers(0, 64)))]
        if how == 2 and arrays:  # (an array frame truncated or grown)
            i = int(self.rng.integers(2, len(raw)))
            cut = int(self.rng.integers(1, len(raw[i]) + 2))
            raw[i] = raw[i][:-cut] if cut <= len(raw[i]) else raw[i] + b"\0" * cut
            return "malformed", raw
        if how == 3:  # (an empty op, or one too long)
            return "malformed", [self.pick([b"", b"r" * 33, b"read" * 40]), *raw[1:]]
        if how == 4:  # (a header over the limit)
            return "malformed", frames(op, {**meta, "pad": "x" * 70000}, arrays)
        if how == 5:  # (NaN, infinities, a 5000-digit number, 5000 levels: JSON's limits)
            bad = self.pick(["NaN", "Infinity", "-Infinity", "9" * 5000, "[" * 5000 + "]" * 5000])
            head = json.dumps({"meta": {**meta, "clock": "@"}, "arrays": specs})
            return "malformed", [op, head.replace('"@"', bad).encode(), *raw[2:]]
        if how == 6:  # (a header that is not an object of meta and arrays)
            top = self.pick([[], 5, "read", None, {"meta": meta}, {"arrays": specs},
                             {"meta": [1], "arrays": specs}, {"meta": None, "arrays": specs},
                             {"meta": meta, "arrays": {}}, {"meta": meta, "arrays": ""},
                             {"meta": meta, "arrays": 3}])  # fmt: skip
            return "malformed", [op, json.dumps(top).encode(), *raw[2:]]
        if how == 7 and arrays:  # (two arrays of one name)
            k, a = self.pick(list(arrays.items()))
            head = frames(op, meta, arrays, [*specs, [k, str(a.dtype), list(a.shape)]])[1]
            return "malformed", [op, head, *raw[2:], a.tobytes()]
        if how == 8:  # (17 arrays)
            many = [[f"a{i}", "int64", [0]] for i in range(17)]
            return "malformed", [op, frames(op, meta, {}, many)[1], *[b""] * 17]
        return "malformed", self.bad_spec(op, meta, arrays, specs)

    def bad_spec(self, op: bytes, meta: dict, arrays: dict, specs: list) -> list[bytes]:
        """One array spec of the header broken: its dtype, name, shape, or its own form."""
        data = [a.tobytes() for a in arrays.values()]
        if not specs:  # (an array of no bytes, to break)
            specs, data = [["x", "int64", [0]]], [b""]
        i = int(self.rng.integers(len(specs)))
        name, dtype, shape = specs[i]
        bad = self.pick([
            [name, self.pick(["float64", "int32", "object", "pickle", "<i8", "", None, 7]), shape],
            [self.pick([5, None, ["x"], "n" * 33]), dtype, shape],
            [name, dtype, self.pick([[-1], [1.0], ["1"], [True], 3, None, [1] * 5, [2**40 + 1]])],
            *([name, dtype, shape] for shape in HUGE_EMPTY),
            [name, dtype], [name, dtype, shape, 0], {"name": name}, "abc", name,
        ])  # fmt: skip
        if isinstance(bad, list) and len(bad) == 3 and bad[2] in HUGE_EMPTY:  # (no bytes)
            data[i] = b""
        specs = [*specs[:i], bad, *specs[i + 1 :]]
        return [op, json.dumps({"meta": meta, "arrays": specs}).encode(), *data]

    def bad_header(self) -> Msg:
        """One header field of a request wrong: its type or range, missing, or one too many."""
        op, meta, arrays, needed = self.base()
        need_meta = [k for k in needed if k in meta]
        how = int(self.rng.integers(3))
        if how == 0 and need_meta:
            gone = self.pick(need_meta)
            meta = {k: v for k, v in meta.items() if k != gone}
        elif how == 1 or not meta:
            meta = {**meta, self.pick(["extra", "op", "error", "ids", "", "meet "]): 1}
        else:
            k = self.pick(list(meta))
            meta = {**meta, k: self.wrong_value(k)}
        return "invalid", frames(op, meta, arrays)

    def wrong_value(self, field: str) -> Any:
        """A value no header field ``field`` may take."""
        if field == "send_all":
            return self.pick([0, 1, "true", None, [], {}, nested(3)])
        common = ["1", 1.0, 0.5, None, [1], {"v": 1}, True, False, nested(int(self.rng.integers(2, 100))),
                  -1, -(2**63), BIG + 1, 2**63, 2**64, 10**30]  # fmt: skip
        if field == "rank":
            common += [self.t.rank, self.t.world, self.t.world + 7]
        return self.pick(common)

    def bad_array(self) -> Msg:
        """One array of a request wrong: dtype, rank, length, values (out of range, NaN,
        infinities), lengths that do not match, missing, or one too many."""
        op, meta, arrays, needed = self.base()
        need = [k for k in needed if k in arrays]
        if not arrays or self.rng.random() < 0.12:  # (an array nobody declared)
            name = self.pick(["x", "weights", "delta" if op != b"dense" else "ids", "state"])
            return "invalid", frames(op, meta, {**arrays, name: np.zeros(2, np.int64)})
        if need and self.rng.random() < 0.12:
            gone = self.pick(need)
            return "invalid", frames(op, meta, {k: a for k, a in arrays.items() if k != gone})
        k = self.pick(list(arrays))
        reason, arrays[k] = self.wrong_array(k, arrays[k])
        return reason, frames(op, meta, arrays)

    def wrong_array(self, name: str, a: np.ndarray) -> tuple[str, np.ndarray]:
        """``a`` made wrong for array ``name``, and the reason it is refused for."""
        how = int(self.rng.integers(5))
        if how == 0:  # (the other dtype)
            return "invalid", a.astype(np.float32 if a.dtype == np.int64 else np.int64)
        if how == 1:  # (a rank it may not have)
            return "invalid", a.reshape(*a.shape, 1, 1) if name == "grad" else a.reshape(-1, 1)
        if how == 2 or not a.size or (how == 3 and a.dtype == np.int64 and name in PARTNERED):
            return "invalid", self.wrong_length(name, a)
        if a.dtype == np.float32:  # (NaN or infinities: non-finite, whatever else it is)
            b = a.copy().reshape(-1)
            b[int(self.rng.integers(b.size)) if self.rng.random() < 0.7 else slice(None)] = (
                self.pick([np.nan, np.inf, -np.inf]))  # fmt: skip
            return "nonfinite", b.reshape(a.shape)
        b = a.copy()  # (a value out of its range: ids outside the table, negative counts)
        hi = {"cnt": MAX_COUNT, "mver": BIG}.get(name, self.t.rows - 1)
        b[int(self.rng.integers(b.size))] = self.pick([-1, -(2**62), hi + 1, 2**63 - 1])
        return "invalid", b

    def wrong_length(self, name: str, a: np.ndarray) -> np.ndarray:
        """``a`` longer than any owner takes, or (arrays whose length another one fixes) one
        row short or over."""
        if name not in PARTNERED or self.rng.random() < 0.4:
            n = self.t.rows * max(self.t.dim, 1) + 1 if name == "grad" else self.t.rows + 1
            return np.resize(a, n)
        return np.resize(a, max(a.shape[0] + self.pick([-1, 1, 2]), 0))
