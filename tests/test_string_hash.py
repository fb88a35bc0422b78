"""The native FNV-1a string hash (vocab.string_keys) vs the numpy and plain-Python references."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest

from hetgmp.data.vocab import MISSING_KEY, fnv1a_reference, string_keys, string_keys_numpy
from hetgmp.native import native


def _random_strings(rng: np.random.Generator, n: int) -> list[str | None]:
    alphabet = list("abcxyz019 ,;\t") + ["é", "ü", "中", "文", "😀", "\x7f"]
    out: list[str | None] = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.1:
            out.append(None)
        elif kind < 0.2:
            out.append("")
        else:
            length = int(rng.integers(1, 400)) if kind > 0.97 else int(rng.integers(1, 12))
            out.append("".join(rng.choice(alphabet, size=length)))
    return out


@pytest.mark.parametrize("arrow_type", [pa.string(), pa.large_string(), pa.binary()])
def test_native_matches_numpy_reference_on_random_strings(arrow_type):
    rng = np.random.default_rng(7)
    vals = _random_strings(rng, 3000)
    vals[5] = "x" * 5000  # one long value
    arr = pa.array([v.encode() if v is not None else None for v in vals]).cast(arrow_type)
    got = string_keys(arr)
    assert got.dtype == np.uint64
    np.testing.assert_array_equal(got, string_keys_numpy(arr))
    assert got.tolist() == [fnv1a_reference((v or "").encode()) for v in vals]
    # a slice (non-zero offset into the shared buffers) and the empty array
    np.testing.assert_array_equal(string_keys(arr.slice(17, 100)), got[17:117])
    assert string_keys(arr.slice(0, 0)).size == 0
    assert string_keys(pa.array([None, None], pa.string())).tolist() == [int(MISSING_KEY)] * 2


def test_non_string_values_are_hashed_as_their_text():
    ints = pa.array([1, 22, None])
    assert string_keys(ints).tolist() == [
        fnv1a_reference(b"1"),
        fnv1a_reference(b"22"),
        int(MISSING_KEY),
    ]


def test_native_rejects_bounds_outside_the_buffer():
    fn = native().fnv1a_keys
    data = np.frombuffer(b"abc", np.uint8)
    with pytest.raises(ValueError, match="outside the 3-byte buffer"):
        fn(np.array([2]), np.array([2]), data)
    with pytest.raises(ValueError, match="differ in length"):
        fn(np.array([0, 1]), np.array([1]), data)


def test_one_long_value_does_not_slow_the_column():
    """Issue 15 item 10: the numpy loop made one pass over the column per byte of the longest
    value, so one 3,000-character value made a 300k-row CSV 8x slower."""
    short = [f"v{i % 977}" for i in range(20000)]
    with_long = short[:-1] + ["q" * 3000]

    def best(values: list[str]) -> float:
        arr = pa.array(values)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            string_keys(arr)
            times.append(time.perf_counter() - t0)
        return min(times)

    base = best(short)
    assert best(with_long) < 4 * base + 0.02
