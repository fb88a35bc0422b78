"""Initial row values: a pure function of (seed, global row id, column), independent of placement.

Uses the splitmix64 mixer (a counter-based hash) in vectorised torch int64 arithmetic, so a row
gets the same initial value on whichever worker stores it, and the single-process reference
table reproduces it exactly. Values are uniform in ``(-scale, scale)`` with 24 random bits.

Speed (issue 33: a host tier initialises every row of a table in host memory, 4.3 G values at
33.8M rows x 128): the rows are hashed a chunk at a time into a small reused workspace with
in-place ops (no temporaries: a fresh large tensor per op costs page faults, most of the time
at that size), and a CUDA ``compute`` device may hash a host table's rows for it. The values
are the same bits on either device and at any chunk size: integer arithmetic wraps alike, and
the float64 steps are exact but for one rounding (times ``scale``), then one to float32.
"""

from __future__ import annotations

import torch

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
CHUNK_ELEMS = 1 << 15  # values hashed at a time on the CPU: a workspace that stays in cache,
# and ops below torch's parallel grain (one thread: no pool that spins on a busy machine)
CHUNK_ELEMS_CUDA = 1 << 24  # ... on a CUDA device (few launches, 256 MiB of workspace)


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


def initial_rows(
    ids: torch.Tensor, dim: int, *, seed: int, scale: float, out: torch.Tensor | None = None,
    compute: torch.device | None = None,
) -> torch.Tensor:  # fmt: skip
    """Initial values ``[len(ids), dim]`` float32 of the rows with global ids ``ids``:
    ``out`` when given (filled; any device), else a new tensor on ``ids``' device.
    ``compute``: where the values are hashed (default: ``ids``' device); the same bits
    anywhere (module docstring)."""
    ids = ids.reshape(-1).to(torch.int64)
    n = ids.numel()
    if out is None:
        out = torch.empty((n, dim), dtype=torch.float32, device=ids.device)
    elif tuple(out.shape) != (n, dim) or out.dtype != torch.float32:
        raise ValueError(f"out must be float32 [{n}, {dim}], got {out.dtype} {tuple(out.shape)}")
    dev = torch.device(compute) if compute is not None else ids.device
    key = int(splitmix64(torch.tensor([seed], dtype=torch.int64))[0])
    step = max(1, (CHUNK_ELEMS_CUDA if dev.type == "cuda" else CHUNK_ELEMS) // max(dim, 1))
    work = _Workspace(min(step, n), dim, dev)
    same = out.device == dev  # (else each chunk is made on ``dev``, then copied over)
    for a in range(0, n, step):  # chunks of rows, not a per-row loop
        b = min(n, a + step)
        vals = work.hash(ids[a:b].to(dev), key, scale, out[a:b] if same else None)
        if not same:
            out[a:b].copy_(vals)
    return out


class _Workspace:
    """Reused buffers for :func:`initial_rows`' chunks of up to ``rows`` rows on ``device``."""

    def __init__(self, rows: int, dim: int, device: torch.device) -> None:
        self.dim = dim
        self.cols = torch.arange(dim, dtype=torch.int64, device=device)
        self.z, self.t = (torch.empty(rows, dim, dtype=torch.int64, device=device) for _ in "zt")
        self.f = torch.empty(rows, dim, dtype=torch.float64, device=device)
        self.v = torch.empty(rows, dim, dtype=torch.float32, device=device)  # (if no dest)

    def hash(
        self, ids: torch.Tensor, key: int, scale: float, dest: torch.Tensor | None
    ) -> torch.Tensor:
        """The chunk's values, written into ``dest`` (else a view of the workspace): the top
        24 bits of :func:`splitmix64` of each ``id * dim + col`` xor ``key`` as
        ``((bits + 0.5) / 2**24 * 2 - 1) * scale``, in place."""
        r = ids.numel()
        z, t, f = self.z[:r], self.t[:r], self.f[:r]
        v = self.v[:r] if dest is None else dest
        torch.add(ids[:, None] * self.dim, self.cols, out=z)
        z.bitwise_xor_(key).add_(_s64(_GOLDEN))
        for k, m in ((30, _M1), (27, _M2), (31, None)):
            torch.bitwise_right_shift(z, k, out=t).bitwise_and_((1 << (64 - k)) - 1)
            z.bitwise_xor_(t)
            if m is not None:
                z.mul_(_s64(m))
        torch.bitwise_right_shift(z, 40, out=t).bitwise_and_((1 << 24) - 1)  # top 24 bits
        # 2 * (bits + 0.5) / 2**24 - 1 == (2 * bits + 1 - 2**24) * 2**-24, exactly
        t.mul_(2).add_(1 - (1 << 24))
        f.copy_(t).mul_(2.0**-24).mul_(scale)  # (the one rounding, as (2u - 1) * scale)
        return v.copy_(f)
