"""Counter-based hashing (splitmix64): the criteo-like generator's source of randomness.

Every random number of :mod:`hetgmp.data.generate` is a hash of ``(seed, purpose, field, sample
index or user/slot)``, so any chunk of samples can be made on its own, in any order, and the same
seed gives byte-identical data for any chunk size and worker count.
"""

from __future__ import annotations

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, in place on a uint64 array (wrapping arithmetic)."""
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


def salt(*parts: int) -> np.uint64:
    """A 64-bit stream key from small integers (seed, purpose, field, ...)."""
    x = np.array([0x2545F4914F6CDD1D], dtype=np.uint64)
    for p in parts:
        x ^= np.uint64(p & 0xFFFFFFFFFFFFFFFF)
        x = mix(x * GOLDEN)
    return np.uint64(x[0])


def uniform(h: np.ndarray) -> np.ndarray:
    """Uniform float64 in [0, 1) from the top 53 bits of a hash."""
    return (h >> _S11).astype(np.float64) * (1.0 / 9007199254740992.0)


def hash_uniform(keys: np.ndarray) -> np.ndarray:
    """Uniform float64 in [0, 1) from the hash of ``keys``."""
    return uniform(mix(keys * GOLDEN))
