"""Raw categorical values -> 64-bit keys -> contiguous per-field ids.

Shared by every reader (Criteo TSV, generic delimited, libsvm, parquet):

* **Keys.** A raw value becomes a ``uint64`` key: Criteo's hashed categoricals are parsed from
  hex exactly (:func:`hex_keys`), other strings are hashed with 64-bit FNV-1a in the native
  extension (:func:`string_keys`; a collision between two distinct strings of one field has
  probability about ``n**2 / 2**65``), integer categories are used as they are. A missing (empty / null)
  value is the reserved key :data:`MISSING_KEY`: it is treated as one more value of the field.
* **Counting** (:class:`KeyCounter`) keeps, per field, sorted unique keys and their counts in
  numpy arrays (plus the first row where each key appeared, when first-appearance order is
  asked for). Block uniques are buffered and merged log-structured, so memory is bounded by the
  vocabulary, not by the input, and no Python object exists per value.
* **Ids** (:class:`FieldVocab`): keys seen at least ``min_count`` times get ids ``0..k-1``
  ordered by descending count (ties by key) or by first appearance; all others share one
  per-field *rare* id ``k``, which exists only when the field has such values (or when it is
  reserved, ``--reserve-rare-id``). So a missing value gets its own id when it is frequent
  enough, else the rare id. The saved form of these maps, and encoding new data with them, is
  :mod:`hetgmp.data.vocab_store`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from hetgmp.native import native_function

MISSING_KEY = np.uint64(2**64 - 1)
ID_ORDERS = ("frequency", "first-appearance")
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MAX_HEX_DIGITS = 15  # keeps every parsed key below MISSING_KEY

_HEX_NIBBLE = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_NIBBLE[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_NIBBLE[_c] = 10 + _i


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, lengths, data bytes) of a pyarrow string/binary array, without copies."""
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        off_dtype: Any = np.int64
    elif pa.types.is_string(arr.type) or pa.types.is_binary(arr.type):
        off_dtype = np.int32
    else:
        raise TypeError(f"expected a string array, got {arr.type}")
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=off_dtype)[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1].astype(np.int64)
    lengths = np.diff(offsets).astype(np.int64)
    if arr.null_count:
        lengths = np.where(arr.is_null().to_numpy(zero_copy_only=False), 0, lengths)
    return starts, lengths, data


_HEX_PAIR = np.full(1 << 16, 0xFFFF, dtype=np.uint16)  # two hex digits (little-endian u16) -> byte
for _hi in range(256):
    for _lo in range(256):
        if _HEX_NIBBLE[_hi] != 255 and _HEX_NIBBLE[_lo] != 255:
            _HEX_PAIR[_hi | (_lo << 8)] = (_HEX_NIBBLE[_hi] << 4) | _HEX_NIBBLE[_lo]
_HEX_PAIR[0] = 0  # two NUL bytes: the zero fill of a null slot (values themselves have no NUL)


def hex8_keys(arr: pa.Array) -> np.ndarray | None:
    """Keys of a ``fixed_size_binary(8)`` array of hex digits (null -> :data:`MISSING_KEY`).

    The fast path of Criteo parsing: each pair of digits is one 64 Ki-entry table lookup.
    Returns None when a non-null value has a non-hex character (the caller then takes the
    general path, which reports it); otherwise exactly what :func:`hex_keys` gives. The values
    must not contain NUL bytes (the caller checked the raw input).
    """
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint64)
    validity, data = arr.buffers()
    pairs = np.frombuffer(data, dtype="<u2")[arr.offset * 4 : (arr.offset + n) * 4]
    byte = _HEX_PAIR[pairs]
    nulls = arr.null_count
    present = arr.is_valid().to_numpy(zero_copy_only=False) if nulls else None
    if byte.max() > 255:
        # A non-hex byte, or a null slot that is not zero-filled: decide per value.
        bad = (byte.reshape(n, 4) > 255).any(axis=1)
        if present is not None:
            bad &= present
        if bad.any():
            return None
    keys = byte.astype(np.uint8).view(">u4").astype(np.uint64)
    if present is not None:  # (nulls)
        keys[~present] = MISSING_KEY
    return keys


def hex_keys(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Parse hex strings (Criteo's hashed categoricals) into keys.

    Returns ``(keys uint64 [n], invalid bool [n])``; empty/null -> :data:`MISSING_KEY`;
    a value with a non-hex character or more than 15 digits is ``invalid``.
    """
    starts, lengths, data = _string_buffers(arr)
    n = len(starts)
    keys = np.full(n, MISSING_KEY, dtype=np.uint64)
    invalid = lengths > _MAX_HEX_DIGITS
    present = np.flatnonzero((lengths > 0) & ~invalid)
    if present.size == 0:
        return keys, invalid
    lens = lengths[present]
    first = int(starts[present[0]])
    width = int(lens.max())
    if (lens == width).all() and int(starts[present[-1]]) - first == width * (present.size - 1):
        # Fast path (every Criteo value is 8 digits): the digits lie back to back in memory.
        nib = _HEX_NIBBLE[data[first : first + width * present.size]].reshape(-1, width)
        if width == 8:
            # Pack digit pairs into bytes and read them as one big-endian uint32 per value.
            bad = (nib == 255).any(axis=1)
            packed = np.ascontiguousarray((nib[:, 0::2] << 4) | (nib[:, 1::2] & 15))
            keys[present] = packed.view(">u4").ravel().astype(np.uint64)
            invalid[present[bad]] = True
            keys[invalid] = MISSING_KEY
            return keys, invalid
        valid_digit = nib != 255
    else:
        pos = np.arange(width, dtype=np.int64)[None, :]
        # Right-align digits so every value is read as ``width`` digits with leading zeros.
        shift = (width - lens)[:, None]
        in_value = pos >= shift
        idx = np.where(in_value, starts[present][:, None] + pos - shift, 0)
        nib = np.where(in_value, _HEX_NIBBLE[data[idx]], 0).astype(np.uint8)
        valid_digit = nib != 255
    bad = ~valid_digit.all(axis=1)
    weights = np.uint64(1) << (np.uint64(4) * np.arange(width - 1, -1, -1, dtype=np.uint64))
    vals = (np.where(valid_digit, nib, 0).astype(np.uint64) * weights[None, :]).sum(
        axis=1, dtype=np.uint64
    )
    keys[present] = vals
    invalid[present[bad]] = True
    keys[invalid] = MISSING_KEY
    return keys, invalid


def _as_string_array(arr: pa.Array) -> pa.Array:
    if (
        pa.types.is_string(arr.type)
        or pa.types.is_binary(arr.type)
        or pa.types.is_large_string(arr.type)
        or pa.types.is_large_binary(arr.type)
    ):
        return arr
    return arr.cast(pa.string())


def string_keys(arr: pa.Array) -> np.ndarray:
    """64-bit FNV-1a hash of every string; empty/null -> :data:`MISSING_KEY`.

    Computed by the native extension (one pass over the bytes, whatever the value lengths);
    :func:`string_keys_numpy` is the same function in numpy, kept as the reference it is
    tested against. There is no fallback: a missing extension raises
    :class:`hetgmp.native.NativeExtensionError`.
    """
    starts, lengths, data = _string_buffers(_as_string_array(arr))
    return native_function("fnv1a_keys")(starts, lengths, data)


def string_keys_numpy(arr: pa.Array) -> np.ndarray:
    """:func:`string_keys` as a vectorized numpy loop over byte positions (the reference).

    Slow when one value is long: every position up to the longest value costs a pass over
    the whole array.
    """
    starts, lengths, data = _string_buffers(_as_string_array(arr))
    h = np.full(len(starts), _FNV_OFFSET, dtype=np.uint64)
    maxlen = int(lengths.max()) if len(lengths) else 0
    with np.errstate(over="ignore"):
        for j in range(maxlen):
            active = lengths > j
            byte = data[np.where(active, starts + j, 0)].astype(np.uint64)
            h = np.where(active, (h ^ byte) * _FNV_PRIME, h)
    h[h == MISSING_KEY] -= np.uint64(1)  # never collide with the missing marker
    h[lengths == 0] = MISSING_KEY
    return h


def fnv1a_reference(value: bytes) -> int:
    """Plain-Python FNV-1a of one value, the reference :func:`string_keys` is tested against."""
    if not value:
        return int(MISSING_KEY)
    h = 0xCBF29CE484222325
    for b in value:
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return h - 1 if h == int(MISSING_KEY) else h


def _merge(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]):
    """Merge (sorted unique keys, counts, first rows) parts into one sorted unique part."""
    keys = np.concatenate([p[0] for p in parts])
    counts = np.concatenate([p[1] for p in parts])
    firsts = None if parts[0][2] is None else np.concatenate([p[2] for p in parts])
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    out_counts = np.add.reduceat(counts[order], starts) if keys.size else counts
    out_first = None
    if firsts is not None:
        out_first = np.minimum.reduceat(firsts[order], starts) if keys.size else firsts
    return keys[starts], out_counts, out_first


class KeyCounter:
    """Streaming per-field key counts in numpy arrays (memory ~ vocabulary, not input)."""

    def __init__(self, num_fields: int, *, track_first: bool = False) -> None:
        self.num_fields = num_fields
        self.track_first = track_first
        self.rows = 0
        empty = (
            np.zeros(0, np.uint64),
            np.zeros(0, np.int64),
            (np.zeros(0, np.int64) if track_first else None),
        )
        self._main = [empty for _ in range(num_fields)]
        self._pending: list[list] = [[] for _ in range(num_fields)]
        self._pending_size = [0] * num_fields

    def add(self, keys: np.ndarray, lists: Sequence[tuple[np.ndarray, np.ndarray]] = ()) -> None:
        """Count a block ``keys [n, F]`` of the next ``n`` rows (in input order) and, for the
        multi-hot fields ``F, F + 1, ...``, every value of each row's list (``(keys, offsets)``
        pairs); ``F + len(lists)`` must be ``num_fields``."""
        n = keys.shape[0]
        if keys.shape[1] + len(lists) != self.num_fields:
            raise ValueError(
                f"block has {keys.shape[1]} + {len(lists)} fields, expected {self.num_fields}"
            )
        for f in range(keys.shape[1]):
            self._add_column(f, keys[:, f], None)
        for k, (values, offsets) in enumerate(lists):
            # a list value's "row" (for first-appearance order) is the row that holds it
            owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
            self._add_column(keys.shape[1] + k, values, owner)
        self.rows += n

    def _add_column(self, f: int, col: np.ndarray, owner: np.ndarray | None) -> None:
        part: tuple[np.ndarray, np.ndarray, np.ndarray | None]  # (first rows: tracked only)
        if self.track_first:
            u, first, cnt = np.unique(col, return_index=True, return_counts=True)
            rows = first.astype(np.int64) if owner is None else owner[first]
            part = (u, cnt.astype(np.int64), rows + self.rows)
        else:
            u, cnt = np.unique(col, return_counts=True)
            part = (u, cnt.astype(np.int64), None)
        self._pending[f].append(part)
        self._pending_size[f] += u.size
        if self._pending_size[f] > max(self._main[f][0].size, 1 << 20):
            self._flush(f)

    def _flush(self, f: int) -> None:
        if self._pending[f]:
            self._main[f] = _merge([self._main[f], *self._pending[f]])
            self._pending[f] = []
            self._pending_size[f] = 0

    def field(self, f: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(sorted unique keys, counts, first row or None) of field ``f``."""
        self._flush(f)
        return self._main[f]


@dataclasses.dataclass
class FieldVocab:
    """Key -> local id map of one field."""

    keys: np.ndarray  # sorted unique keys seen in pass 1
    ids: np.ndarray  # local id of each key (rare ones share rare_id)
    cardinality: int
    rare_id: int | None  # local id shared by values below min_count (None: no such values)
    num_values: int  # distinct raw values (missing counted as one)
    num_rare_values: int
    missing_id: int | None  # local id of the missing value (None: never missing)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Local ids of ``keys``; a key not seen in pass 1 maps to the rare id.

        A block repeats its values a lot, so the distinct ones are looked up (a sort of the
        block, then a cache-friendly search of sorted needles) and the ids spread back.
        """
        if keys.ndim == 1 and keys.size > 1024:
            uniq, inverse = np.unique(keys, return_inverse=True)
            return self._lookup(uniq)[inverse]
        return self._lookup(keys)

    def _lookup(self, keys: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(self.keys, keys)
        pos_c = np.minimum(pos, max(self.keys.size - 1, 0))
        found = (
            (pos < self.keys.size) & (self.keys[pos_c] == keys)
            if self.keys.size
            else (np.zeros(keys.shape, bool))
        )
        if found.all():
            return self.ids[pos_c]
        if self.rare_id is None:
            raise RuntimeError(
                "a value not seen while counting has no rare id to map to; "
                "did the input change between the two passes?"
            )
        return np.where(found, self.ids[pos_c], self.rare_id)


def build_vocab(
    keys: np.ndarray,
    counts: np.ndarray,
    first: np.ndarray | None,
    *,
    min_count: int,
    id_order: str,
    reserve_rare: bool = False,
) -> FieldVocab:
    """Assign contiguous local ids to the counted keys of one field (see module docstring).

    ``reserve_rare`` gives the field its rare id ``k`` even when no value is below
    ``min_count``, so a value unseen here (a later ``--vocab-from`` run, serving) has an id of
    its own instead of sharing one with a real value.
    """
    if id_order not in ID_ORDERS:
        raise ValueError(f"--id-order: {id_order!r} is not one of {ID_ORDERS}")
    kept = np.flatnonzero(counts >= min_count)
    if id_order == "frequency":
        order = kept[np.lexsort((keys[kept], -counts[kept]))]
    else:
        if first is None:
            raise ValueError("first-appearance order needs counts made with track_first=True")
        order = kept[np.argsort(first[kept], kind="stable")]
    k = int(order.size)
    has_rare = k < keys.size or reserve_rare
    ids = np.full(keys.size, k, dtype=np.int64)
    ids[order] = np.arange(k, dtype=np.int64)
    missing_id = None
    if keys.size and keys[-1] == MISSING_KEY:
        missing_id = int(ids[-1])
    return FieldVocab(
        keys=keys,
        ids=ids,
        cardinality=k + int(has_rare),
        rare_id=k if has_rare else None,
        num_values=int(keys.size),
        num_rare_values=int(keys.size - k),
        missing_id=missing_id,
    )


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer: a bijection of uint64 (so distinct ints stay distinct)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def int_keys(values: np.ndarray) -> np.ndarray:
    """Keys of integer categories (libsvm ids, integer parquet columns).

    splitmix64 is a bijection, so distinct integers never collide; the single integer whose
    image is :data:`MISSING_KEY` is moved next to it (a 2**-64 event).
    """
    k = splitmix64(np.asarray(values).astype(np.int64).view(np.uint64))
    k[k == MISSING_KEY] -= np.uint64(1)
    return k
