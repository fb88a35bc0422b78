"""Pooled lookups of multi-hot fields (issue 34): a bag of rows becomes one row per field.

A batch's ids arrive as one ``[B, F + W]`` matrix: the ``F`` single-hot ids, then every
multi-hot field's bag padded with :data:`PAD_ID` to that field's width (``widths``, summing to
``W``; :mod:`hetgmp.data.multi_hot_padded` lays the data set out so). :meth:`BagLayout.lookup`
asks the table for the rows of the single-hot ids and of every bag value in **one** call (one
table step: the table applies the previous step's gradient at each call), then pools each
sample's bag per field: ``sum`` adds its rows, ``mean`` divides the sum by the bag's length (an
empty bag pools to zeros, as ``nn.EmbeddingBag`` does). The model sees ``[B, F + K, D]``: the
single-hot rows, then one pooled row per multi-hot field.

The pooling is written plainly (:class:`PoolBags`: ``index_add`` forward; the backward hands
every bag value its bag's pooled gradient, divided by the bag's length under ``mean``), the
reference the fused kernels are tested against; the table then sums a row's gradients over all
its occurrences, as for single-hot ids. With ``backend="triton"`` (``--kernels``, resolved by
:func:`hetgmp.models.pooling_fused.resolve_pooling`) the pooling and the single-hot rows go
into the model's input in one kernel, and back in one (:mod:`hetgmp.models.pooling_fused`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from torch import nn

from hetgmp.choices import POOLINGS
from hetgmp.data.multi_hot_padded import PAD_ID
from hetgmp.models.pooling_fused import pool_fields, segment_offsets


class PoolBags(torch.autograd.Function):
    """``out[s] = sum of rows[i] with seg[i] == s`` (times ``scale[s]``): the pooled rows
    ``[S, D]`` of the bag values' rows ``[E, D]``; backward: ``grad_rows[i] = grad_out[seg[i]]
    * scale[seg[i]]``."""

    @staticmethod
    def forward(
        ctx: Any, rows: torch.Tensor, seg: torch.Tensor, scale: torch.Tensor, segments: int
    ) -> torch.Tensor:
        ctx.save_for_backward(seg, scale)
        out = rows.new_zeros(segments, rows.shape[1], dtype=torch.float32)
        out.index_add_(0, seg, rows.float())
        return (out * scale.unsqueeze(1)).to(rows.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        seg, scale = ctx.saved_tensors
        return (grad * scale.unsqueeze(1).to(grad.dtype)).index_select(0, seg), None, None, None


def pool(rows: torch.Tensor, seg: torch.Tensor, segments: int, mode: torch.Tensor) -> torch.Tensor:
    """Rows ``[E, D]`` pooled into ``[segments, D]`` by segment ``seg [E]``; ``mode [segments]``
    (bool) marks the segments pooled by ``mean`` (the rest: ``sum``)."""
    count = torch.bincount(seg, minlength=segments).to(torch.float32)
    scale = torch.where(mode, 1.0 / count.clamp(min=1.0), torch.ones_like(count))
    return PoolBags.apply(rows, seg, scale, segments)


@functools.lru_cache(maxsize=16)
def _constants(
    widths: tuple[int, ...], pooling: tuple[str, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused path's per-layout tensors on ``device``, made once (a host-to-device copy per
    step costs host time): each field's last padded column, the fields pooled by mean."""
    ends = torch.tensor(widths, device=device).cumsum(0) - 1
    return ends, torch.tensor([p == "mean" for p in pooling], device=device)


def _fixed_rows(table: nn.Module, flat: torch.Tensor) -> torch.Tensor:
    """The table's rows for the fixed-shape pooling, in float32 even under CUDA autocast: the
    table's lookup otherwise hands them over in bf16 (``autocast_rows_dtype``), and a bag's
    values summed in bf16 lost precision and depended on the path: the captured multi-rank
    step and the eager one differed by 4e-4 in the rows after 2 epochs under autocast, 7e-8
    without (2 H100s, 2026-11-27). The pooled rows still meet the model's first layer in
    autocast's dtype."""
    if flat.device.type != "cuda" or not torch.is_autocast_enabled("cuda"):
        return table(flat)
    with torch.autocast("cuda", enabled=False):
        return table(flat)


# batches whose table ids a layout keeps for their lookup (the one about to be trained and
# the next, as the host tier's queue: hetgmp.embedding.tier_ahead.DEPTH)
TOLD_DEPTH = 2


@dataclasses.dataclass(frozen=True)
class BagLayout:
    """Where a batch's bags sit in its id matrix and how each field pools them."""

    num_single: int  # F: single-hot ids first
    widths: tuple[int, ...]  # each multi-hot field's padded width, in order
    pooling: tuple[str, ...]  # each multi-hot field's pooling (sum / mean)
    backend: str = "torch"  # the pooling: torch ops (the reference) or the Triton kernels
    # fixed shapes (:meth:`_filled`): the table is handed every slot, a padding slot standing
    # in for a row its sample already holds, and the pooling masks it out; nothing the step
    # does then depends on a bag's length on the host (a whole-step CUDA graph can hold it)
    fixed: bool = False
    # fixed shapes, compact (:meth:`_packed`, with ``fixed``): the table is handed the single-hot
    # ids and the batch's bag values packed into a fixed capacity C (set by the first
    # :meth:`fit`, from an epoch's batches), the rest of C filled with rows the batch
    # holds (their gradient zero): ~the batch's own ids, not every padded slot. A batch with
    # more bag values than C takes the variable layout (an eager step: exact).
    compact: bool = False
    _capacity: list[int] = dataclasses.field(
        default_factory=lambda: [0], init=False, compare=False, repr=False
    )
    # the last batches :meth:`table_ids` flattened (at most TOLD_DEPTH) and their table ids:
    # a lookup of such a batch hands the table that same tensor, which a table told of it
    # ahead recognises by identity (``--sync async``'s reads sent ahead: the next batch told
    # after this step's lookup; ``--rows-on host``'s read-ahead: told before it, so two)
    _told: list[tuple[torch.Tensor, torch.Tensor]] = dataclasses.field(
        default_factory=list, init=False, compare=False, repr=False
    )
    # fixed batch buffers and the fixed buffers holding their table ids (:meth:`pin`: a
    # multi-rank whole step's ring slots, whose plans were made ahead from those table ids)
    _pinned: dict[int, tuple[torch.Tensor, torch.Tensor]] = dataclasses.field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if len(self.pooling) != len(self.widths):
            raise ValueError(
                f"--pooling names {len(self.pooling)} modes for {len(self.widths)} multi-hot "
                "fields: give one mode for all, or one per field"
            )
        bad = [p for p in self.pooling if p not in POOLINGS]
        if bad:
            raise ValueError(f"--pooling {bad[0]!r}: expected one of {POOLINGS}")
        if self.backend not in ("torch", "triton"):
            raise ValueError(f"pooling backend {self.backend!r}: expected 'torch' or 'triton'")

    @property
    def num_fields(self) -> int:
        """Fields the model sees: the single-hot ones, then one pooled row per bag field."""
        return self.num_single + len(self.widths)

    @property
    def width(self) -> int:
        """Columns of a batch's id matrix (``F + W``)."""
        return self.num_single + sum(self.widths)

    def _checked(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` as a ``[B, F + W]`` batch (an empty one of any width: a rank out of samples
        still meets the others at the table's step with the trainer's ``[0, F]`` batch, which
        knows nothing of bags); a wrong shape is refused, naming the layout."""
        if ids.dim() == 2 and ids.shape[0] == 0:
            ids = ids.new_zeros((0, self.width))
        if ids.dim() != 2 or ids.shape[1] != self.width:
            raise ValueError(
                f"ids of shape {tuple(ids.shape)}: a multi-hot batch has {self.width} columns "
                f"({self.num_single} single-hot + bags padded to {list(self.widths)})"
            )
        return ids

    def table_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """The ``[N, 1]`` ids the table is handed for the batch ``ids [B, F + W]``: the
        single-hot ids, then every bag value (padding slots taken out). The next
        :meth:`lookup` of this same tensor hands the table this same result, so a table told
        of the batch ahead (``DistributedEmbedding.send_ahead``) takes what it sent."""
        flat = self._flat(ids)
        self._told.append((ids, flat))
        del self._told[:-TOLD_DEPTH]  # (the oldest, never looked up: forgotten)
        return flat

    @property
    def capacity(self) -> int:
        """Bag values a compact fixed lookup hands the table (0: not compact, or not set)."""
        return self._capacity[0] if self.fixed and self.compact else 0

    def table_rows(self, batch_size: int) -> int:
        """The ids the table is handed for a full batch in fixed shapes."""
        c = self.capacity
        return batch_size * self.num_single + c if c else batch_size * self.width

    def bag_values(
        self, sparse: torch.Tensor, positions: torch.Tensor, batch_size: int
    ) -> torch.Tensor:
        """``[steps]`` (int64, ``sparse``'s device): the bag values of each of an epoch's
        batches (``positions`` into ``sparse [N, F + W]``, batch after batch)."""
        steps = positions.numel() // max(batch_size, 1)
        lengths = (sparse[:, self.num_single :] != PAD_ID).sum(1)
        per = lengths.index_select(0, positions[: steps * batch_size].long())
        return per.view(steps, batch_size).sum(1)

    def set_capacity(self, capacity: int) -> None:
        """The compact lookup's capacity, fixed now (:meth:`fit` then keeps it)."""
        self._capacity[0] = max(0, int(capacity))

    def fit(self, need: list[int], batch_size: int) -> list[bool]:
        """Whether batches of ``need`` bag values each fit the compact capacity, which the
        first call sets from them (their most, with 2 % and 256 to spare, a multiple of 256);
        all True when not compact."""
        if not (self.fixed and self.compact) or not need:
            return [True] * len(need)
        if not self._capacity[0]:
            c = -(-(max(need) * 102 // 100 + 256) // 256) * 256
            self._capacity[0] = min(c, batch_size * sum(self.widths))
        return [n <= self._capacity[0] for n in need]

    def _flat(self, ids: torch.Tensor) -> torch.Tensor:
        batch = self._checked(ids)
        if self.capacity and batch.shape[0]:
            packed = self._packed(batch)
            if packed is not None:
                return packed
        elif self.fixed:
            return self._filled(batch).reshape(-1, 1)
        f = self.num_single
        bags = batch[:, f:]
        return torch.cat([batch[:, :f].reshape(-1), bags[bags != PAD_ID]]).unsqueeze(1)

    def _packed(self, batch: torch.Tensor) -> torch.Tensor | None:
        """``[B * F + C, 1]``: the single-hot ids, then the bag values in order (sample by
        sample, field by field), then rows the batch holds (its bag values again, in turn;
        without any, its first single-hot id, else row 0). Fixed shapes, no host read, in a
        captured step; eagerly None when the batch has more than C values (the variable
        layout then: exact)."""
        f, c = self.num_single, self.capacity
        present = (batch[:, f:] != PAD_ID).reshape(-1)
        pos = torch.cumsum(present, 0) - 1
        capturing = batch.is_cuda and torch.cuda.is_current_stream_capturing()
        if not capturing and int(pos[-1]) + 1 > c:
            return None
        buf = batch.new_zeros(c + 1)  # (the last: where padding slots write, dropped)
        buf.scatter_(0, torch.where(present & (pos < c), pos, c), batch[:, f:].reshape(-1))
        e = (pos[-1] + 1).clamp(max=c)
        t = torch.arange(c, device=batch.device)
        fallback = batch[0, 0] if f else batch.new_zeros(())
        values = torch.where(
            t < e, buf[:c], torch.where(e > 0, buf.gather(0, t % e.clamp(min=1)), fallback)
        )
        return torch.cat([batch[:, :f].reshape(-1), values]).unsqueeze(1)

    def _filled(self, batch: torch.Tensor) -> torch.Tensor:
        """``batch [B, F + W]`` with every padding slot holding a row its sample holds
        already: the bag's own values in turn (a bag's values come first), an empty bag's
        slots the sample's first single-hot id (row 0 without one). The table then fetches no
        extra row and sums zeros into these rows' gradients (the pooling masks the slots out:
        exact values; only their occurrence counts grow)."""
        f, out, col = self.num_single, batch.clone(), self.num_single
        fallback = batch[:, :1] if f else torch.zeros_like(batch[:, :1])
        for w in self.widths:
            bag = batch[:, col : col + w]
            n = (bag != PAD_ID).sum(1, keepdim=True)
            turn = torch.arange(w, device=batch.device) % n.clamp(min=1)
            filled = torch.where(n > 0, bag.gather(1, turn), fallback.expand_as(bag))
            out[:, col : col + w] = torch.where(bag != PAD_ID, bag, filled)
            col += w
        return out

    def flat_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """The ``[N, 1]`` table ids of the batch ``ids``, made now (nothing told)."""
        return self._flat(ids)

    def pin(self, ids: torch.Tensor, flat: torch.Tensor) -> None:
        """From now on a lookup of the buffer ``ids`` hands the table the buffer ``flat``
        (whose contents the caller keeps equal to ``ids``'s table ids: a multi-rank whole
        step's ring slot, planned ahead); a buffer pinned to ``flat`` before is unpinned (at
        most one per table-ids buffer: the pins do not pile up)."""
        for key in [k for k, v in self._pinned.items() if v[1] is flat]:
            del self._pinned[key]
        self._pinned[id(ids)] = (ids, flat)

    def _take(self, ids: torch.Tensor) -> torch.Tensor:
        """The table ids of ``ids``: a pinned buffer's (:meth:`pin`), or those
        :meth:`table_ids` gave for this very tensor (forgotten then, with the batches told
        before it), else made now and not kept (an evaluation's batch between steps leaves
        the told ones)."""
        pinned = self._pinned.get(id(ids))
        if pinned is not None and pinned[0] is ids:
            return pinned[1]
        for i, (told, flat) in enumerate(self._told):
            if told is ids:
                del self._told[: i + 1]
                return flat
        return self._flat(ids)

    def lookup(self, table: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """``[B, F + K, D]`` rows of ``ids [B, F + W]`` from ``table`` (one call; the ids it
        is handed: :meth:`table_ids`)."""
        flat = self._take(ids)
        ids = self._checked(ids)
        b, f, k = ids.shape[0], self.num_single, len(self.widths)
        present = ids[:, f:] != PAD_ID
        if self.fixed:  # (rows in float32 under autocast: see _fixed_rows)
            rows = _fixed_rows(table, flat)
        else:
            rows = table(flat)  # [B * F + E, 1, D]: one table step
        d = rows.shape[-1]
        rows = rows.reshape(flat.shape[0], d)
        if self.fixed and not self.capacity:
            return self._pool_fixed(rows.reshape(b, self.width, d), present)
        if self.backend == "triton" or self.capacity:  # (compact: its tail needs the offsets)
            ends, mean = _constants(self.widths, self.pooling, ids.device)
            off = segment_offsets(present, ends)
            tail = bool(self.capacity) and flat.shape[0] == b * f + self.capacity
            return pool_fields(rows, off, mean, b, f, backend=self.backend, tail=tail)
        mean = torch.tensor([p == "mean" for p in self.pooling], device=ids.device)
        # the bag field of every padded column, then the segment (sample, field) of every value
        col_field = torch.repeat_interleave(
            torch.arange(k, device=ids.device), torch.tensor(self.widths, device=ids.device)
        )
        seg = (torch.arange(b, device=ids.device).unsqueeze(1) * k + col_field)[present]
        pooled = pool(rows[b * f :], seg, b * k, mean.repeat(b))
        return torch.cat([rows[: b * f].reshape(b, f, d), pooled.reshape(b, k, d)], dim=1)

    def _pool_fixed(self, rows: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """``[B, F + K, D]`` from every slot's row ``rows [B, F + W, D]``: each bag field's
        slots summed under the ``present`` mask (``[B, W]``), divided by the bag's length
        under ``mean`` (an empty bag: zeros). Fixed shapes only."""
        f, parts, col = self.num_single, [rows[:, : self.num_single]], 0
        for w, mode in zip(self.widths, self.pooling, strict=True):
            keep = present[:, col : col + w].unsqueeze(2)
            s = (rows[:, f + col : f + col + w] * keep.to(rows.dtype)).sum(1, keepdim=True)
            if mode == "mean":
                s = s / keep.sum(1, keepdim=True).clamp(min=1).to(s.dtype)
            parts.append(s)
            col += w
        return torch.cat(parts, dim=1)
