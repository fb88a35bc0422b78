"""A step's batch plan: the batch's unique ids in block order (owned | mirrors by owner | not
stored here by owner), their counts and slots, built once per step on the device without a
host sync; and the records a step keeps until its gradient is applied.

Unique rows without sorting the ids: every occurrence gets its row's *leader* occurrence, the
row's first (a scatter-min of positions into a per-row map, read back); the leaders, keyed by
block, are then ordered by one stable sort of small int32 keys (non-leaders last, as padding),
and the block sizes come from a binary search in the sorted keys (a bincount would sync on
CUDA). That is the torch reference; with the Triton backend the same plan comes from five
fused kernels (:mod:`hetgmp.embedding.kernels.prep`: per-program key histograms and ranks
instead of the sort). The unique count is only known on the host after the sizes exchange.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

import torch

from hetgmp.embedding.kernels import prep as prep_kernels
from hetgmp.embedding.kernels.prep import PlanArrays, new_min_map, prepare_triton

if TYPE_CHECKING:  # pragma: no cover
    from hetgmp.embedding.padded.buffers import StaticExchange


@dataclasses.dataclass
class Prep:
    """A batch's ids preprocessed on the device. ``u`` holds the unique ids in *block order*,
    then padding up to ``N``; ``blocks[k]`` is the size of block key ``k`` (own: ``rank``;
    mirror: ``w + owner``; not stored: ``2w + owner``). Padding (``u / cnt / slot`` past
    ``blocks.sum()``) is unspecified: both plans fill it with the other occurrences (count 0)
    today, but every reader copies it or masks it off (``tests/test_padded_kernels.py``
    poisons it), so a plan may leave it as it was."""

    ids: torch.Tensor  # [B, F] on the device
    bad: torch.Tensor  # () bool: an id outside [0, num_rows)
    u: torch.Tensor  # [N] int64
    cnt: torch.Tensor  # [N] int64 occurrences
    slot: torch.Tensor  # [N] int64, -1 = not stored
    inv: torch.Tensor  # [N] position in u of every input id (int32)
    blocks: torch.Tensor  # [3w] int64
    source: torch.Tensor | None  # the tensor given to prefetch (identity check in forward)
    ring: int = -1  # the PrepRing slot holding these arrays (-1: not from a ring)
    static: bool = False  # the arrays are a captured graph's outputs (fixed addresses)

    def tensors(self) -> list[torch.Tensor]:
        return [self.ids, self.bad, self.u, self.cnt, self.slot, self.inv, self.blocks]

    @property
    def fields(self) -> int | None:
        """Occurrences per sample (``ids [B, F]``: F), for the gradient sum's per-field runs
        (:func:`hetgmp.embedding.kernels.scatter_add_rows`); None for flat ids."""
        return int(self.ids.shape[-1]) if self.ids.dim() == 2 else None


@dataclasses.dataclass
class Batch:
    """A step's unique rows in block order (sizes now host-known); kept until its gradient is
    staged at the next step."""

    u: torch.Tensor
    cnt: torch.Tensor
    slot: torch.Tensor
    inv: torch.Tensor
    n_own: int
    n_mir: int
    nqr: list[int]  # rows not stored, per owner
    # the same on the device ([w] int64); None: made from ``nqr`` when needed (the pre-sync
    # path reads the counts from its own table and needs it only when it falls back)
    nqr_dev: torch.Tensor | None
    # padded exchange: the preprocessed batch and the StaticExchange that ran it (its
    # gradient is summed into that one's buffer, see StaticExchange.sum_grad)
    prep: Prep | None = None
    static: StaticExchange | None = None
    # recorded while a whole-step CUDA graph was captured: its host counts are the capture's,
    # not a replay's (:meth:`~hetgmp.embedding.padded.whole.WholeStep.materialize`)
    replayed: bool = False

    @property
    def ring(self) -> int:
        """The preparation ring slot of its arrays (-1: none), which keys the exchange's
        per-slot buffers (its summed gradient, its sizes tables)."""
        return self.prep.ring if self.prep is not None else -1

    def nqr_device(self, device: torch.device) -> torch.Tensor:
        """``nqr`` on the device."""
        if self.nqr_dev is None:
            self.nqr_dev = torch.tensor(self.nqr, dtype=torch.int64, device=device)
        return self.nqr_dev


class LocalBatch(NamedTuple):
    """A one-rank step's occurrences: kept until its gradient is applied at the next step.
    (A tuple: built every step, cheaper than a dataclass.)"""

    slot: torch.Tensor  # [B, F] int64 row of every occurrence
    lead: torch.Tensor | None  # [B * F] int32 leader occurrence (Adagrad), None: empty batch


class Occurrences(NamedTuple):
    """A padded step's gradient as it came back: one row per occurrence (``[n, D]`` float32
    contiguous), not yet summed per unique row (the sum runs inside the next step's pre-sync
    graph, or eagerly where that graph does not run)."""

    grad: torch.Tensor


class Summed(NamedTuple):
    """A padded step's gradient summed per unique row already (``StaticExchange.grad``, a
    fixed buffer), in backward: the whole-step graph's form (nothing of the step then lives
    in a graph's memory pool; :mod:`hetgmp.embedding.padded.whole`)."""

    grad: torch.Tensor


class BatchPlanner:
    """Builds :class:`Prep` for a table's id -> slot / block maps (``slot_of``, ``block_of``
    ``[num_rows]`` int32 on ``device``); ``backend`` (a resolved kernels name): ``"torch"``
    runs the reference below, ``"triton"`` the same plan in five fused kernels
    (:func:`hetgmp.embedding.kernels.prep.prepare_triton`), equal to it element for element
    but for :class:`Prep`'s padding."""

    def __init__(
        self, slot_of: torch.Tensor, block_of: torch.Tensor, world: int, device: torch.device,
        backend: str = "torch",
    ) -> None:  # fmt: skip
        self.slot_of, self.block_of, self.world, self.device = slot_of, block_of, world, device
        self.backend = backend
        self.num_rows = int(slot_of.numel())
        self._arange_3w1 = torch.arange(3 * world + 1, dtype=torch.int32, device=device)
        self._size_cache: dict[tuple[str, int], torch.Tensor] = {}
        self.pos_map32: torch.Tensor | None = None  # row -> leader occurrence (leaders())
        self.min_map: torch.Tensor | None = None  # the Triton plan's leader map (INT32_MAX)
        self.cnt_map: torch.Tensor | None = None  # (prep.MARK_BY_FIELD: row counts, zero)

    def prepare(self, ids: torch.Tensor, out: PlanArrays | None = None) -> Prep:
        """Unique ids in block order (see :class:`Prep`); fixed-size ops only, no host sync.
        ``out``: the arrays to write it into (a preparation ring's fixed buffers)."""
        if self.backend == "triton" and self.num_rows > 0:
            return self._prepare_triton(ids, out)
        prep = self.prepare_reference(ids)
        if out is None:
            return prep
        for name in PlanArrays._fields:  # (the reference's own arrays, copied)
            getattr(out, name).copy_(getattr(prep, name))
        return dataclasses.replace(prep, **out._asdict())

    def _prepare_triton(self, ids: torch.Tensor, out: PlanArrays | None = None) -> Prep:
        """:meth:`prepare` in the fused kernels."""
        if self.min_map is None:  # (like pos_map32: made at a first, eager call, not in a
            self.min_map = new_min_map(self.num_rows, self.device)  # graph's memory pool)
        if prep_kernels.MARK_BY_FIELD and self.cnt_map is None:  # (its rows' counts)
            self.cnt_map = torch.zeros(self.num_rows, dtype=torch.int32, device=self.device)
        a = prepare_triton(
            ids, self.slot_of, self.block_of, self.min_map, self.world, self.cnt_map, out
        )
        return Prep(ids=ids, bad=a.bad, u=a.u, cnt=a.cnt, slot=a.slot, inv=a.inv,
                    blocks=a.blocks, source=ids)  # fmt: skip

    def prepare_reference(self, ids: torch.Tensor) -> Prep:
        """:meth:`prepare` in torch ops: the reference of the fused kernels."""
        w = self.world
        flat = ids.reshape(-1)
        n = flat.numel()
        # Clamped so that a bad id cannot index out of range before the step reports it.
        clamped = flat.clamp(0, self.num_rows - 1)
        bad = (clamped != flat).any()
        # index_select, not advanced indexing: one kernel, no index-tensor broadcasting.
        lead = self.leaders(clamped)
        ar = self.per_size("arange", n)
        key = torch.where(lead == ar, self.block_of.index_select(0, clamped), 3 * w)
        order = torch.argsort(key, stable=True)
        starts = torch.searchsorted(key.index_select(0, order), self._arange_3w1)
        pos = torch.empty(n, dtype=torch.int32, device=ids.device).scatter_(0, order, ar)
        cnt = torch.zeros(n, dtype=torch.int64, device=ids.device).index_add_(
            0, lead, self.per_size("ones", n)
        )  # occurrences, at the leader
        u = clamped.index_select(0, order)
        return Prep(
            ids=ids,
            bad=bad,
            u=u,
            cnt=cnt.index_select(0, order),
            slot=self.slot_of.index_select(0, u).long(),
            inv=pos.index_select(0, lead),
            blocks=starts[1:] - starts[:-1],
            source=ids,
        )

    def leaders(self, rows: torch.Tensor) -> torch.Tensor:
        """For every occurrence (a global row id), the position of its row's leader
        occurrence (int32), so ``lead == arange`` marks exactly one occurrence per row: the
        row's first occurrence (a minimum, not ``index_copy_``'s any writer: deterministic,
        and what the fused kernels pick)."""
        if self.pos_map32 is None:
            self.pos_map32 = torch.empty(self.num_rows, dtype=torch.int32, device=self.device)
        ar = self.per_size("arange", rows.numel())
        self.pos_map32.scatter_reduce_(0, rows, ar, "amin", include_self=False)
        return self.pos_map32.index_select(0, rows)

    def per_size(self, kind: str, n: int) -> torch.Tensor:
        """``arange(n)`` int32 (``kind="arange"``: positions) or ``ones(n)`` int64 (``"ones"``:
        occurrence counts), kept per batch size (train and eval sizes alternate; a slice of one
        buffer would cost a view op per call)."""
        key = (kind, n)
        t = self._size_cache.get(key)
        if t is None:
            if kind == "arange":
                t = torch.arange(n, dtype=torch.int32, device=self.device)
            else:
                t = torch.ones(n, dtype=torch.int64, device=self.device)
            # Bounded for callers with ever-changing sizes; entries are never dropped (one may
            # be in use on another CUDA stream), extra sizes just get a fresh tensor.
            if len(self._size_cache) < 8:
                self._size_cache[key] = t
        return t


def input_problem(ids: object) -> str | None:
    """Type / dtype / shape problem of a batch (host-side facts, no device access)."""
    if not isinstance(ids, torch.Tensor):
        return f"ids must be a torch.Tensor, got {type(ids).__name__}"
    if ids.dtype != torch.int64:
        return f"ids must be int64 (torch.long), got {ids.dtype}"
    if ids.dim() != 2:
        return f"ids must have shape [batch, fields], got {tuple(ids.shape)}"
    return None


def range_error(ids: torch.Tensor, num_rows: int) -> str:
    """The message for a batch whose device flag said an id is out of range (error path only)."""
    lo, hi = torch.stack([ids.min(), ids.max()]).tolist()
    bad = lo if lo < 0 else hi
    return f"id {bad} is outside [0, {num_rows}) (table has {num_rows} rows)"
