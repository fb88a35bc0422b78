"""World 1, the degenerate transport: no peers, every row owned and stored at slot = id.

A step is the previous step's update and a lookup of the batch's ids (repeats included) in two
fused kernels (:func:`~hetgmp.embedding.kernels.mark_local`: clamp + range flag + leader map;
:func:`~hetgmp.embedding.kernels.take_local`: rows + leaders + distinct count), with **no**
host sync, no sort and no unique. SGD adds every occurrence's gradient straight into the table
(linear, so equal to adding the row sums); Adagrad first sums a row's occurrences into one
leader occurrence chosen through a per-row position map (one scatter: any occurrence may win,
all read the same winner), then updates at every occurrence with a zero step at the
non-leaders. Row versions are not kept: they exist for mirrors' staleness, and one rank has no
mirrors. Under CUDA autocast the rows come out in its dtype (bf16); a gradient of any float
dtype is applied in fp32. Bad ids are reported from a device flag; on CUDA it is read at a later step
(:meth:`LocalStep.drain_bad_checks`), so the host never waits for the device.

Written for the host: every tensor op and attribute write here costs host time on each step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hetgmp.embedding.batch import LocalBatch, range_error
from hetgmp.embedding.context import OP_FLUSH, StepContext
from hetgmp.embedding.errors import EmbeddingInputError
from hetgmp.embedding.kernels import mark_local, scatter_add_rows, take_local
from hetgmp.embedding.ops import current_stream

BAD_RING = 16  # CUDA bad-id checks in flight at most (then the oldest is waited for)
# a batch's ids, or how to get them (a batch gathered inside a CUDA graph: only on an error)
Ids = torch.Tensor | Callable[[], torch.Tensor]


def autocast_rows_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype a lookup's rows leave in: CUDA autocast's when it is on (a bf16 first layer
    would cast the ``[B, F, D]`` rows anyway and cast their gradient back: two passes over
    them, ~0.6 ms of a WDL step at batch 65536 on an H200, 0.14 ms of the 2-GPU step at 8192 on
    an H100), else None (the table's). The one-rank and the padded lookups both use it."""
    if device.type == "cuda" and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return None


class LocalStep:
    """The one-rank step (see the module docstring). ``grads``: the last training step's
    ``(LocalBatch, gradient [B, F, D])``, applied at the next step."""

    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx
        store = ctx.store
        self.weight, self.opt_state, self.num_rows = store.weight, store.opt_state, store.num_rows
        self.device = dev = store.device
        # rows the lookup indexes: the table's, or with a host tier its device cache's (the
        # step then runs on cache slots, which :meth:`TieredRows.prefetch` hands out)
        self.tier = tier = ctx.tier
        self._map_rows = self.num_rows
        if tier is not None:
            self.weight, self.opt_state = tier.cache_weight, tier.cache_state
            self.device = dev = tier.device
            self._map_rows = tier.slots
        self.grads: tuple[LocalBatch, torch.Tensor] | None = None
        self._pos_map: torch.Tensor | None = None  # row -> leader occurrence
        self._gsum: torch.Tensor | None = None  # Adagrad row sums, zero between steps
        self._bad_flag = torch.zeros(1, dtype=torch.int32, device=dev)
        # CUDA: pending bad-id checks (ring slot of the pinned flag and its copy's event, the
        # batch), oldest first. Flags and events come from a ring made once: a pinned
        # allocation and a new event per step cost host time on every step.
        self._bad_checks: list[tuple[int, Ids]] = []
        self._bad_ring: tuple[torch.Tensor, list[torch.cuda.Event]] | None = None
        self._bad_next = 0
        # While a CUDA graph captures the step (``capturing``), the range flag is folded into
        # ``sticky_bad`` instead: a pinned copy and an event record cannot be captured and
        # read back per replay; the replaying caller hands it to :meth:`replayed`.
        self.capturing = False
        self.sticky_bad = torch.zeros(1, dtype=torch.int32, device=dev)

    def step(
        self, ids: torch.Tensor, *, op: int, error: str | None
    ) -> tuple[torch.Tensor, LocalBatch]:
        """Apply the last step's gradient, then gather this batch's rows (``ids [B, F]`` on
        the device -> ``[B, F, D]``)."""
        ctx = self.ctx
        ctx.timer.mark("unique")
        if self._bad_checks:
            self.drain_bad_checks(wait=op == OP_FLUSH)
        if error:
            raise EmbeddingInputError(f"rank {ctx.env.rank}: {error}")
        n, orig = ids.numel(), ids
        if self.tier is not None and n:
            ids = self._resident(ids)  # (cache slots: the range flag names the ids, ``orig``)
        counts = ctx.counters.local_counts
        pos_map = self._pos_map
        if n:
            if pos_map is None:
                pos_map = torch.empty(self._map_rows, dtype=torch.int32, device=self.device)
                self._pos_map = pos_map
            slots = mark_local(
                ids, pos_map, self._bad_flag, counts[0], self._map_rows, backend=ctx.kernels
            )
            self._check(orig)
        else:
            slots = ids
            counts[0].zero_()
        if self.grads is not None:
            self._apply(*self.grads)
            self.grads = None
        ctx.timer.mark("update")
        if n:
            assert pos_map is not None  # (made above for any n)
            values, lead = take_local(
                self.weight, slots, pos_map, self._bad_flag, counts[0], counts[1],
                backend=ctx.kernels, out_dtype=autocast_rows_dtype(self.device),
            )  # fmt: skip
        else:
            values, lead = self.weight.new_zeros(*ids.shape, ctx.store.dim), None
        if not self.capturing:  # (a replayed step is counted by :meth:`replayed`)
            ctx.counters.count_local_step()
        return values, LocalBatch(slots, lead)

    def _resident(self, ids: torch.Tensor) -> torch.Tensor:
        """(Host tier) the last step's update first, while its rows are surely resident (held),
        then this batch's rows made resident (ahead, when the table was told of it) and held
        until its own update: their cache slots, which the step looks up instead."""
        tier = self.tier
        assert tier is not None
        self.apply_pending()
        tier.release()  # (an evaluation's rows, never updated)
        try:  # (while a graph captures: the device tier's lookup without its host part)
            slots = tier.lookup_captured(ids) if self.capturing else tier.lookup(ids)
        except EmbeddingInputError as e:
            raise EmbeddingInputError(f"rank {self.ctx.env.rank}: {e}") from None
        # (the device tier's working table grows with the largest batch: .tier_device)
        self.weight, self.opt_state = tier.cache_weight, tier.cache_state
        if self._map_rows != tier.slots:
            self._map_rows, self._pos_map = tier.slots, None
        return slots

    def apply_pending(self) -> None:
        """Apply the last backward's gradient now instead of at the next step (the same
        arithmetic: nothing reads the rows in between); a whole-step CUDA graph needs it, so
        that the update is part of the step whose replay produced the gradient."""
        if self.grads is not None:
            self._apply(*self.grads)
            self.grads = None

    def _apply(self, pb: LocalBatch, pg: torch.Tensor) -> None:
        """The last batch's gradient (one row per occurrence)."""
        opt = self.ctx.opt
        if pb.lead is None:  # (an empty batch)
            return
        if opt.name == "sgd":  # linear: every occurrence's gradient added directly
            opt.apply(self.weight, self.opt_state, pb.slot, pg)
            if self.tier is not None:  # (its held rows: written back when evicted)
                self.tier.updated()
            return
        # Row sums at the leader occurrence, then one update per row at its leader. The sums
        # go into a buffer kept at zero between steps: the update zeroes the leader rows it
        # read, and only those were added to (a [B * F, D] fill is 0.035 ms of a 0.67 ms WDL
        # step at batch 8192 on an H100). A smaller batch uses its prefix.
        n = pb.lead.numel()
        buf = self._gsum
        if buf is None or buf.shape[0] < n or buf.shape[1] != pg.shape[-1]:
            buf = torch.zeros(n, pg.shape[-1], dtype=torch.float32, device=pg.device)
            self._gsum = buf
        gsum = buf[:n]
        f = pb.slot.shape[-1] if pb.slot.dim() == 2 else None  # (per-field runs: [B, F])
        scatter_add_rows(gsum, pb.lead, pg, backend=self.ctx.kernels, fields=f)
        opt.apply_leaders(
            self.weight, self.opt_state, pb.slot.reshape(-1), gsum, pb.lead, consume=True
        )
        if self.tier is not None:  # (its held rows: written back when evicted)
            self.tier.updated()

    def _check(self, ids: torch.Tensor) -> None:
        """This batch's out-of-range flag (set by :func:`mark_local`). On CPU it is read at
        once (cleared before raising: the step stops before :func:`take_local` would clear
        it). On CUDA it is copied to pinned memory and read by a later
        :meth:`drain_bad_checks`."""
        if self.capturing:  # (one lookup per step: each replay rewrites it)
            self.sticky_bad.copy_(self._bad_flag)
            return
        if self.device.type != "cuda":
            if int(self._bad_flag):
                self._bad_flag.zero_()
                raise EmbeddingInputError(
                    f"rank {self.ctx.env.rank}: {range_error(ids, self.num_rows)}"
                )
            return
        self._note_flag(self._bad_flag, ids)

    def before_replay(self) -> None:
        """A replayed step graph is about to run: the host tier's part of its lookup."""
        if self.tier is not None:
            self.tier.before_replay()

    def layout(self) -> tuple[int, int]:
        """What a captured step graph holds of this step's tensors: the rows' address and the
        slots' range (a device tier's working table grows with a larger batch: a graph holding
        the old one is captured again)."""
        return self.weight.data_ptr(), self._map_rows

    def replayed(self, ids: Ids) -> None:
        """After a replayed step graph: count the step (host counters) and queue its range
        flag (for a later :meth:`drain_bad_checks`; ``ids``: the batch it trained, or how to
        get it, named in the error; the next replay rewrites the flag)."""
        self.ctx.counters.count_local_step()
        if self._bad_checks:
            self.drain_bad_checks(wait=False)
        self._note_flag(self.sticky_bad, ids)

    def _note_flag(self, flag: torch.Tensor, ids: Ids) -> None:
        """Copy ``flag`` to the pinned ring, asynchronously, and remember the batch."""
        ring = self._bad_ring
        if ring is None:
            ring = (
                torch.zeros(BAD_RING, dtype=torch.int32, pin_memory=True),
                [torch.cuda.Event() for _ in range(BAD_RING)],
            )
            self._bad_ring = ring
        slot = self._bad_next
        self._bad_next = (slot + 1) % BAD_RING
        ring[0][slot : slot + 1].copy_(flag, non_blocking=True)
        ring[1][slot].record(current_stream(self.device))
        self._bad_checks.append((slot, ids))

    def drain_bad_checks(self, *, wait: bool) -> None:
        """CUDA: read the out-of-range flags of earlier batches whose device->host copy is
        done (all of them with ``wait``, at flush; the oldest when the ring is full); the
        steps in between ran with the bad ids clamped into range, and the error names the
        batch it was."""
        ring = self._bad_ring
        assert ring is not None
        while self._bad_checks and (
            wait
            or len(self._bad_checks) == BAD_RING  # the ring is full: wait for the oldest
            or ring[1][self._bad_checks[0][0]].query()
        ):
            slot, ids = self._bad_checks.pop(0)
            ring[1][slot].synchronize()
            if bool(ring[0][slot]):
                self._bad_checks.clear()
                ids = ids if isinstance(ids, torch.Tensor) else ids()
                raise EmbeddingInputError(
                    f"rank {self.ctx.env.rank}: an earlier batch: {range_error(ids, self.num_rows)}"
                )
