"""Initial row values: a pure function of (seed, global row id, column), independent of placement.

Uses the splitmix64 mixer (a counter-based hash) in vectorised torch int64 arithmetic, so a row
gets the same initial value on whichever worker stores it, and the single-process reference
table reproduces it exactly. Values are uniform in ``(-scale, scale)`` with 24 random bits.
"""

from __future__ import annotations

import torch

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_CHUNK_ELEMS = 1 << 22  # bounds the int64 temporaries when initialising millions of rows


def _s64(c: int) -> int:
    """An unsigned 64-bit constant as the signed int64 torch stores."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser of ``x + golden`` on int64 tensors (wrapping arithmetic)."""
    z = x + _s64(_GOLDEN)
    z = (z ^ _shr(z, 30)) * _s64(_M1)
    z = (z ^ _shr(z, 27)) * _s64(_M2)
    return z ^ _shr(z, 31)


def initial_rows(ids: torch.Tensor, dim: int, *, seed: int, scale: float) -> torch.Tensor:
    """Initial values ``[len(ids), dim]`` float32 of the rows with global ids ``ids``."""
    ids = ids.to(torch.int64)
    out = torch.empty((ids.numel(), dim), dtype=torch.float32, device=ids.device)
    key = int(splitmix64(torch.tensor([seed], dtype=torch.int64))[0])
    cols = torch.arange(dim, dtype=torch.int64, device=ids.device)
    step = max(1, _CHUNK_ELEMS // max(dim, 1))
    for a in range(0, ids.numel(), step):  # chunks of rows, not a per-row loop
        ctr = ids[a : a + step, None] * dim + cols[None, :]
        bits = _shr(splitmix64(ctr ^ key), 40)  # top 24 bits
        u = (bits.to(torch.float64) + 0.5) / float(1 << 24)
        out[a : a + step] = ((2.0 * u - 1.0) * scale).to(torch.float32)
    return out
