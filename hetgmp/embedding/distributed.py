"""The distributed embedding table: owned + mirrored rows per worker, bounded-staleness sync.

Storage per worker (all on ``env.device``):

* ``weight [S, D]`` float32, ``version [S]`` int64 and the optimizer state of the ``S = n_own +
  n_mir`` stored rows: slots ``[0, n_own)`` are the rows this worker owns, ``[n_own, S)`` its
  mirrors. For an owned row ``version`` counts the sample-level updates applied (one per
  occurrence of the id in a batch); for a mirror it is the owner version its value reflects.
* mirrors also keep ``pending`` (local updates not yet pushed), ``grad_acc`` (their raw summed
  gradient, what is pushed) and ``delta_acc`` (what was applied locally, re-added on refresh).
* id -> slot map: a dense global ``slot_of [num_rows]`` int32 table (-1 = not stored) plus
  ``block_of [num_rows]`` int32, the row's block key in a batch (own: ``rank``; mirror:
  ``w + owner``; not stored: ``2w + owner``; one gather instead of six elementwise ops per
  step on owner and slot). 8 bytes per global row: 270 MB for Criteo's 33.8M rows, small
  next to the rows themselves, and a lookup is one gather (no search, no hashing).

One ``forward`` is one training step (see DESIGN.md, "The staleness protocol"). It is written
for the GPU: fixed-size tensor ops, and the host waits for the device only to read the two
exchanged sizes tables (sizes must be known to call ``all_to_all_single``):

0. preprocess (:meth:`prefetch` can run it for the next batch on a side CUDA stream): unique
   ids without ``torch.unique``'s sync, padded, sorted into blocks: owned rows | mirrors by
   owner | rows not stored here by owner (block sizes by binary search, no bincount); the
   range check of the ids is a device flag;
1. stage the previous step's gradients (write rule): its owned rows are applied with the
   pushes; its mirrors apply them locally and become due once ``pending > bound`` (mirrors are
   stored grouped by owner, so the due ones are one stable compaction, in peer order); its rows
   not stored here are pushed;
2. sizes exchange 1 (**host sync 1**: one device->host copy of the table sent and received):
   per-peer query / push counts, the bad-id flag (status), bound, audit flag, operation; then
   payload 1, written once in peer order: query ids (mirrors, then rows not stored), the
   mirrors' versions, push ids + counts + gradients;
3. owners apply own + pushed gradients (one optimizer update per row per step, the sum of all
   contributions, which makes bound 0 equal the single-process reference; SGD adds the
   contributions directly, Adagrad merges repeats through a per-slot position map), then
   answer: an int32 lag for every mirror query, and value (+ optimizer state + int64 version)
   for mirrors beyond the requester's bound and for every row not stored there (owned rows are
   never queried); sizes exchange 2 (**host sync 2**) and payload 2 carry them back. With
   ``replies="all"`` owners answer every mirror query with its value, the reply sizes are the
   query counts known since exchange 1, and host sync 2 is skipped (more bytes, one sync);
4. stale mirrors are refreshed (owner value + own unpushed delta) and the batch's rows
   gathered: owned + mirror rows straight from storage, the rest from the reply.

``exchange="padded"`` (SGD, ``replies="all"``, training steps) runs the same protocol on
fixed-capacity buffers so that its compute runs as five replayed CUDA graphs, the host only
launching them, the three all-to-alls and the one device->host copy
(:mod:`hetgmp.embedding.static_exchange`); the exact path above sizes every payload exactly.

With ONE rank (and no audit) a fast path replaces all of this: every row is owned and stored
at slot = id, so there is no unique at all. A step is the previous step's update and a lookup
of the batch's ids (repeats included) in two fused kernels (clamp + range flag + leader map;
rows + leaders + distinct count), with **no** host sync and no sort: SGD adds
every occurrence's gradient straight into the table (linear, so equal to adding the row sums);
Adagrad first sums a row's occurrences into one "leader" occurrence chosen through a per-row
position map (one scatter: any occurrence may win, all read the same winner), then updates at
every occurrence with a zero step at the non-leaders. The same map counts the distinct rows
(leaders) for the counters. Bad ids are reported from a device flag; on CUDA it is read at the
next call (see :meth:`_drain_bad_checks`). Row versions are not kept on this path: they exist for
mirrors' staleness, and one rank has no mirrors.

The sizes table also carries each rank's status and operation, so a rank with bad input makes
its peers fail at once with :class:`PeerFailedError` instead of waiting for a timeout.
Counters: host-known parts (owned / not-stored rows, bytes) are Python ints; the mirror
fresh / stale-ok / refreshed / deferred counts stay on the device until :meth:`counters`.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hetgmp.comm.env import DistEnv
from hetgmp.comm.errors import PeerFailedError
from hetgmp.comm.exchange import exchange_payload, exchange_sizes
from hetgmp.embedding import sizes
from hetgmp.embedding.counters import ROW_KINDS, zero_counters
from hetgmp.embedding.errors import EmbeddingInputError, StalenessViolation
from hetgmp.embedding.init import initial_rows
from hetgmp.embedding.kernels import (
    gather_rows,
    mark_local,
    scatter_add_rows,
    take_local,
    take_rows,
)
from hetgmp.embedding.kernels import resolve as resolve_kernels
from hetgmp.embedding.ops import compact, current_stream, index_add_rows
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.placement import owner_array, plan_placement
from hetgmp.embedding.profile import PhaseTimer
from hetgmp.embedding.static_exchange import Capacity, PrepRing, StaticExchange, grow
from hetgmp.partition.plan import Plan

# columns of the sizes table (hetgmp.embedding.sizes)
_NQM, _NQR, _NP, _NDUE, _STATUS, _BOUND, _SEND_ALL, _OP, _NOWN, _MAXQ, _MAXP, _PADDED = (
    sizes.NQM, sizes.NQR, sizes.NP, sizes.NDUE, sizes.STATUS, sizes.BOUND, sizes.SEND_ALL,
    sizes.OP, sizes.NOWN, sizes.MAXQ, sizes.MAXP, sizes.PADDED,
)  # fmt: skip
_OP_FORWARD, _OP_FLUSH = 1, 2
_OP_NAMES = {_OP_FORWARD: "forward", _OP_FLUSH: "flush"}
REPLIES = ("stale", "all")
EXCHANGES = ("exact", "padded")


@dataclasses.dataclass
class _Prep:
    """A batch's ids preprocessed on the device (no host sync; :meth:`prefetch` can run it
    on a side stream). ``u`` holds the unique ids in *block order*: owned rows, then mirrors
    grouped by owner, then rows not stored here grouped by owner (inside a block in the order
    of their leader occurrences), then padding: the other occurrences, count 0 (the unique
    count is only known on the host after size exchange 1); ``blocks[k]`` is the size of block
    key ``k`` (own: ``rank``; mirror: ``w + owner``; not stored: ``2w + owner``)."""

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


@dataclasses.dataclass
class _Batch:
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
    # world-1 fast path: every occurrence's leader occurrence (see DistributedEmbedding._leaders)
    lead: torch.Tensor | None = None
    # padded exchange: the preprocessed batch and the StaticExchange that ran it (its
    # gradient is summed into that one's buffer, see StaticExchange.sum_grad)
    prep: _Prep | None = None
    static: StaticExchange | None = None


class _LocalBatch(NamedTuple):
    """A one-rank step's occurrences (the fast path): kept until its gradient is applied at
    the next step. (A tuple: built every step, cheaper than the :class:`_Batch` dataclass.)"""

    slot: torch.Tensor  # [B, F] int64 row of every occurrence
    lead: torch.Tensor | None  # [B * F] int32 leader occurrence (Adagrad), None: empty batch


class _LocalLookup(torch.autograd.Function):
    """The one-rank step as one autograd node: forward runs :meth:`DistributedEmbedding.
    _step_local` and returns the ``[B, F, D]`` rows; backward hands their gradient to the
    embedding (applied at its next step) and returns none. Replaces a leaf + tensor hook +
    view (``register_hook`` costs Python work per step; the backward then ran ViewBackward and
    AccumulateGrad, which stored a ``.grad`` nobody reads). Autograd only calls a backward
    whose node has an input that requires grad: that is ``anchor``, a 0-d leaf of the module
    that never gets a gradient (None is returned for it)."""

    @staticmethod
    def forward(
        ctx: Any, anchor: torch.Tensor, emb: DistributedEmbedding, ids: torch.Tensor
    ) -> torch.Tensor:
        values, batch = emb._step_local(ids, op=_OP_FORWARD, error=None)
        ctx.emb, ctx.batch = emb, batch
        return values

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        # (as the hook did: a later backward through the same output replaces the gradient;
        # with create_graph the gradient has a graph, which the in-place update must not join)
        ctx.emb._grads = (ctx.batch, grad.detach() if grad.requires_grad else grad)
        return None, None, None


class _Occurrences(NamedTuple):
    """A padded step's gradient as it came back: one row per occurrence (``[n, D]`` float32
    contiguous), not yet summed per unique row. The sum (a zero-fill and a scatter-add into
    the StaticExchange's gradient buffer) runs inside the next step's pre-sync graph, or
    eagerly (:meth:`DistributedEmbedding._summed`) where that graph does not run."""

    grad: torch.Tensor


class _PaddedLookup(torch.autograd.Function):
    """A padded training step's lookup as one autograd node: forward gathers the occurrences'
    rows from the step's unique values (``values[inv]``), backward hands their gradient to the
    embedding unsummed and launches nothing (the sum is part of the next step's pre-sync
    graph). Replaces a leaf + tensor hook + gather node + view (the backward then ran a
    zero-fill and a scatter launch, ViewBackward and AccumulateGrad: ~0.25 ms of host time per
    step on the H200 machine, bench/gpu/profile_host.py). ``anchor``: see :class:`_LocalLookup`."""

    @staticmethod
    def forward(
        ctx: Any, anchor: torch.Tensor, emb: DistributedEmbedding, values: torch.Tensor,
        batch: _Batch, shape: tuple[int, int, int],
    ) -> torch.Tensor:  # fmt: skip
        ctx.emb, ctx.batch = emb, batch
        return take_rows(values, batch.inv, backend=emb.kernels).view(shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, ...]:
        g = grad.detach().reshape(-1, grad.shape[-1])
        if g.dtype != torch.float32 or not g.is_contiguous():
            g = g.to(torch.float32).contiguous()  # (e.g. the expanded gradient of a sum())
        ctx.emb._grads = (ctx.batch, _Occurrences(g))
        return None, None, None, None, None


class _GraphReleaser:
    """An ``env.closers`` entry: releases a table's CUDA graphs, if the table still lives."""

    def __init__(self, emb: Any) -> None:
        self._emb = weakref.ref(emb)

    @classmethod
    def register(cls, env: DistEnv, emb: Any) -> None:
        """Add one for ``emb`` to ``env.closers``, dropping those of tables gone meanwhile (a
        bench builds many tables on one env)."""
        env.closers[:] = [c for c in env.closers if not isinstance(c, cls) or c.alive]
        env.closers.append(cls(emb))

    @property
    def alive(self) -> bool:
        return self._emb() is not None

    def __call__(self) -> None:
        emb = self._emb()
        if emb is not None:
            emb.release_graphs()


class DistributedEmbedding(nn.Module):
    """An embedding table spread over the ranks of ``env`` (see the module docstring).

    ``plan`` (if given) decides owners and mirror priorities; otherwise ``placement`` (``hash``:
    ``id % world``; ``random``) decides owners and there are no mirrors. ``store_rate`` is the
    share of all rows each worker mirrors (top of its plan priority list). ``bound`` is the
    staleness bound in owner-applied sample-level updates (0 = bulk-synchronous). ``audit``
    makes owners return values for every query and records/checks every read's lag
    (``last_audit``); it costs bandwidth and is meant for tests. ``kernels`` picks the row-update
    backend (:mod:`hetgmp.embedding.kernels`: ``auto`` = Triton on CUDA, torch otherwise); the
    resolved name is ``self.kernels``. ``replies``: ``"stale"`` (owners send values only for
    mirrors beyond the bound: fewest bytes, but the reply sizes need a second host round trip
    per step) or ``"all"`` (owners send a value for every mirror queried and the requester keeps
    the stale ones: more bytes, one host sync per step instead of two; for fast links such as
    NVLink, where a host round trip costs more than the bytes); ``"auto"``: ``"all"`` on NCCL,
    else ``"stale"``. Both read the same values. ``exchange``: ``"exact"`` (payloads sized
    exactly, ~150 small ops per multi-rank step) or ``"padded"`` (fixed-capacity payloads,
    :mod:`hetgmp.embedding.static_exchange`; on CUDA a step replays a few CUDA graphs when
    ``cuda_graphs``, with its all-to-alls captured inside them on NCCL when
    ``graph_collectives``: a process group of its own per env, ``env.groups``); padded needs
    SGD, ``replies="all"`` and no audit, and is used for training steps (eval and flush stay
    exact). ``"auto"``: padded where it applies on CUDA
    with several ranks (one rank takes its own fast path; ``exchange`` then says ``"exact"``).
    Attributes the padded exchange works on: ``*_full`` (state tensors with the trash row;
    ``weight``, ``version``... are views without it), ``trash_slot``, ``mir_owner``,
    ``mir_arange``; diagnostics: ``padded_rebuilds`` (every capacity taken) and
    ``padded_presyncs`` (steps whose pre-sync part ran in fixed shapes).
    """

    def __init__(
        self,
        num_rows: int,
        dim: int,
        env: DistEnv,
        plan: Plan | None = None,
        *,
        placement: str = "hash",
        store_rate: float = 0.0,
        bound: int = 0,
        optimizer: str = "sgd",
        lr: float = 0.01,
        init_scale: float = 0.01,
        seed: int = 0,
        adagrad_eps: float = 1e-10,
        adagrad_init: float = 0.0,
        audit: bool = False,
        kernels: str = "auto",
        replies: str = "stale",
        exchange: str = "auto",
        cuda_graphs: bool = True,
        graph_collectives: bool = True,
    ) -> None:
        super().__init__()
        if num_rows < 1 or dim < 1:
            raise ValueError(f"num_rows and dim must be >= 1, got {num_rows} and {dim}")
        if not 0 <= bound < _I32_MAX:
            # lags travel as int32; a larger bound would be "never sync" anyway
            raise ValueError(f"bound must be in [0, 2**31 - 1), got {bound}")
        if not 0.0 <= store_rate <= 1.0:
            raise ValueError(f"store_rate must be in [0, 1], got {store_rate}")
        self.num_rows, self.dim, self.bound = int(num_rows), int(dim), int(bound)
        if replies not in (*REPLIES, "auto"):
            raise ValueError(f"replies must be 'auto' or one of {REPLIES}, got {replies!r}")
        if replies == "auto":  # measured on 2x H200 (NVLink): "all" 1.2-1.45x faster per step
            replies = "all" if env.backend == "nccl" else "stale"
        self.env, self.device, self.audit, self.replies = env, env.device, audit, replies
        # Owners send a value for every mirror query (audit, or replies="all"): reply sizes
        # then follow from exchange 1 alone (see _step).
        self._send_all = audit or replies == "all"
        self.kernels = resolve_kernels(kernels, env.device)
        self.opt = SparseOptimizer(optimizer, lr, adagrad_eps, adagrad_init, self.kernels)
        if exchange not in (*EXCHANGES, "auto"):
            raise ValueError(f"exchange must be 'auto' or one of {EXCHANGES}, got {exchange!r}")
        padded_ok = optimizer == "sgd" and replies == "all" and not audit
        if exchange == "padded" and not padded_ok:
            raise ValueError(
                "exchange='padded' needs optimizer='sgd', replies='all' and audit off; got "
                f"optimizer={optimizer!r}, replies={replies!r} (after 'auto': 'all' on NCCL, "
                f"'stale' otherwise), audit={audit}"
            )
        exchange_auto = exchange == "auto"
        if exchange_auto:  # (one rank: decided below, the fast path uses neither)
            exchange = "padded" if padded_ok and env.device.type == "cuda" else "exact"
        self.exchange = exchange
        self._graphs = bool(cuda_graphs) and env.device.type == "cuda"
        self._graph_collectives = bool(graph_collectives)
        self._comm_padded: DistEnv | None = None  # see _padded_comm
        self._static: StaticExchange | None = None  # buffers of the padded exchange (lazily)
        self.padded_rebuilds: list[Capacity] = []  # every capacity the padded exchange took
        self.padded_presyncs = 0  # steps whose pre-sync part ran in fixed shapes
        self._rings: dict[tuple[int, ...], PrepRing] = {}  # per batch shape (padded exchange)
        w, r = env.world_size, env.rank
        if plan is not None:
            owner, mirrors = plan_placement(plan, self.num_rows, w, r, store_rate)
        else:
            if store_rate > 0:
                raise ValueError("store_rate > 0 needs a plan (it ranks the rows to mirror)")
            owner, mirrors = owner_array(self.num_rows, w, placement, seed), np.zeros(0, np.int64)
        owned = np.flatnonzero(owner == r)
        # Mirrors grouped by owner (priority order inside a group): the mirrors due for a push
        # then come out of one stable compaction already in destination order.
        mirrors = mirrors[np.argsort(owner[mirrors], kind="stable")]
        mir_end = np.cumsum(np.bincount(owner[mirrors], minlength=w)).astype(np.int64)
        self.n_own, self.n_mir = int(owned.size), int(mirrors.size)
        # World-1 fast path (see the module docstring): needs slot == id, true when rank 0
        # owns every row (owned == arange(num_rows)) and mirrors nothing.
        self._local = w == 1 and not audit and self.n_own == self.num_rows and self.n_mir == 0
        if self._local and exchange_auto:
            self.exchange = "exact"  # (what the logs report; the one-rank path uses neither)
        # CUDA, world 1: pending bad-id checks (ring slot of the pinned flag and its copy's
        # event, the batch), oldest first; each is read once its copy is done (see
        # _drain_bad_checks). Flags and events come from a ring made once: a pinned allocation and
        # a new event per step cost host time on every step.
        self._bad_checks: list[tuple[int, torch.Tensor]] = []  # (ring slot, the batch's ids)
        self._bad_ring: tuple[torch.Tensor, list[torch.cuda.Event]] | None = None
        self._bad_next = 0
        slot_of = np.full(self.num_rows, -1, dtype=np.int32)
        slot_of[owned] = np.arange(self.n_own, dtype=np.int32)
        slot_of[mirrors] = self.n_own + np.arange(self.n_mir, dtype=np.int32)
        dev = self.device
        block_of = owner.astype(np.int32) + 2 * w  # not stored here: 2w + owner
        block_of[owned] = r
        block_of[mirrors] -= w  # mirror: w + owner
        self.block_of = torch.from_numpy(block_of).to(dev)
        self.slot_of = torch.from_numpy(slot_of).to(dev)
        self.stored_ids = torch.from_numpy(np.concatenate([owned, mirrors]).astype(np.int64)).to(
            dev
        )
        # With several ranks every state tensor has one extra "trash" row after the real ones
        # (weight/version: slot S = n_own + n_mir; mirror buffers: n_mir) where the padded
        # exchange writes its padding entries; the public tensors are views without it.
        s_rows, extra = self.n_own + self.n_mir, int(w > 1)
        self.trash_slot = s_rows
        init_ids = torch.cat([self.stored_ids, torch.zeros(extra, dtype=torch.int64, device=dev)])
        self.weight_full = initial_rows(init_ids, self.dim, seed=seed, scale=init_scale)
        self.version_full = torch.zeros(s_rows + extra, dtype=torch.int64, device=dev)
        self.pending_full = torch.zeros(self.n_mir + extra, dtype=torch.int64, device=dev)
        self.grad_acc_full = torch.zeros(self.n_mir + extra, self.dim, device=dev)
        self.delta_acc_full = torch.zeros(self.n_mir + extra, self.dim, device=dev)
        self.weight = self.weight_full[:s_rows] if extra else self.weight_full
        self.version = self.version_full[:s_rows]
        self.opt_state = self.opt.new_state(s_rows, dev)
        self.pending = self.pending_full[: self.n_mir]
        self.grad_acc = self.grad_acc_full[: self.n_mir]
        self.delta_acc = self.delta_acc_full[: self.n_mir]
        # owner of every mirror slot (mirrors are grouped by owner) and 0..n_mir-1
        self.mir_owner = torch.from_numpy(owner[mirrors].astype(np.int64)).to(dev)
        self.mir_arange = torch.arange(self.n_mir, dtype=torch.int64, device=dev)
        self._mir_end = torch.from_numpy(mir_end).to(dev)
        self._mir_start = torch.from_numpy(np.concatenate([[0], mir_end[:-1]])).to(dev)
        self._zeros_w = torch.zeros(w, dtype=torch.int64, device=dev)
        # block boundaries to search in the sorted int32 keys (same dtype as block_of)
        self._arange_3w1 = torch.arange(3 * w + 1, dtype=torch.int32, device=dev)
        self._size_cache: dict[tuple[str, int], torch.Tensor] = {}  # see _per_size
        self._pos_map32: torch.Tensor | None = None  # row -> leader occurrence (_leaders)
        self._const_cache: dict[tuple[int, int, bool], torch.Tensor] = {}  # see _const_cols
        self._pos_map: torch.Tensor | None = None  # Adagrad merge scratch ([n_own], lazily)
        self._side: torch.cuda.Stream | None = None  # prefetch stream (CUDA)
        self._prefetched: _Prep | None = None
        self._grads: tuple[_Batch, torch.Tensor] | None = None
        self._bytes_total = zero_counters()
        self._bytes_step = zero_counters()
        # Row counters: host-known parts as ints, device-known parts (fresh, stale-ok,
        # refreshed, deferred) as a device vector read only when counters are asked for.
        self._rows_host_total = {"owned": 0, "not_stored": 0}
        self._rows_host_step = dict(self._rows_host_total)
        # [fresh, stale-ok, refreshed, deferred, owned (world-1 fast path: not host-known)]
        self._rows_dev_total = torch.zeros(5, dtype=torch.int64, device=dev)
        self._rows_dev_step = torch.zeros_like(self._rows_dev_total)
        # World-1 fast path: the distinct-row counts (step, total) that its lookup kernel adds
        # to in place (views made once), and the out-of-range flag it sets (see mark_local).
        self._local_counts = (self._rows_dev_step[4:], self._rows_dev_total[4:])
        self._bad_flag = torch.zeros(1, dtype=torch.int32, device=dev)
        # World-1 fast path: the leaf its autograd node hangs on (see _LocalLookup; a plain
        # attribute, not a parameter: it never gets a gradient), the step's byte counters
        # (constant: nothing is sent; one dict for every step, copied by step_counters) and
        # the device ids need not be moved from (cuda without an index: the current one).
        self._anchor = torch.zeros((), requires_grad=True)
        self._local_bytes_step = zero_counters()
        self._local_bytes_step["steps"] = 1
        self._ids_device = dev
        if dev.type == "cuda" and dev.index is None:
            self._ids_device = torch.device("cuda", torch.cuda.current_device())
        self.last_audit: dict[str, torch.Tensor] | None = None
        self.timer = PhaseTimer(dev, enabled=False)  # bench/ turns it on: timer.enabled = True

    # Per-step bookkeeping, assigned several times a step. nn.Module.__setattr__ checks every
    # assignment for parameters, buffers and submodules (~7 us each on the host, measured with
    # cProfile: ~50 us of a 230 us world-1 step); these plain attributes skip it.
    _PLAIN_ATTRS = frozenset(
        {"_prefetched", "_grads", "_bytes_step", "_rows_dev_step", "_rows_dev_total",
         "_rows_host_step", "_size_cache", "_pos_map32", "_pos_map", "_side", "_bad_ring",
         "_bad_next", "padded_presyncs", "_static", "_anchor"}
    )  # fmt: skip

    def __setattr__(self, name: str, value: Any) -> None:
        if name in DistributedEmbedding._PLAIN_ATTRS:
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    # ------------------------------------------------------------------ public API
    def prefetch(self, ids: torch.Tensor) -> None:
        """Start the id preprocessing (unique ids, slot/owner lookup, block order) of the NEXT
        batch now; a following ``forward`` given this same tensor object uses it.

        On CUDA the work runs on a side stream, so it overlaps the current step (it needs no
        host sync: the unique rows come from :meth:`_leaders`); on CPU it runs at once.
        Input problems (dtype, shape) are left for ``forward`` to report collectively."""
        if self._local or _input_problem(ids) is not None:
            # (one rank: nothing to prepare, the step's own kernels clamp and check the ids;
            # a side stream would only add stream waits and record_stream calls per step)
            self._prefetched = None
            return
        if self.device.type != "cuda":
            self._prefetched = self._prep_new(ids.to(self.device, non_blocking=True))
            return
        if self._side is None:
            self._side = torch.cuda.Stream(device=self.device)
        main = current_stream(self.device)
        self._side.wait_stream(main)  # ids (and the tables) are written on the main stream
        with torch.cuda.stream(self._side):
            dev_ids = ids.to(self.device, non_blocking=True)
            prep = self._prep_new(dev_ids)
        dev_ids.record_stream(self._side)
        self._prefetched = prep

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up ``ids [B, F]`` (int64) -> ``[B, F, D]``; one call is one training step."""
        if self._local:
            return self._forward_local(ids)
        err = _input_problem(ids)
        prep = self._prefetched
        self._prefetched = None
        self.timer.start()
        if err is not None:
            prep = self._prepare(torch.zeros(0, 1, dtype=torch.int64, device=self.device))
        elif prep is not None and prep.source is ids:
            if self.device.type == "cuda" and self._side is not None:
                main = current_stream(self.device)
                main.wait_stream(self._side)
                if not prep.static:  # (a captured graph's outputs live in its own pool)
                    for t in prep.tensors():  # allocated on the side stream, used on this one
                        t.record_stream(main)
        else:
            if self._side is not None:  # a discarded prefetch may still use the leader map
                current_stream(self.device).wait_stream(self._side)
            prep = self._prep_new(ids.to(self.device))
        prep.source = None
        b, f = prep.ids.shape
        values, batch = self._step(prep, op=_OP_FORWARD, error=err)
        if prep.ring >= 0:  # the ring's other slot is free for the next batch
            self._rings[tuple(prep.ids.shape)].last = prep.ring
        if batch.static is not None and self.training and torch.is_grad_enabled():
            out = _PaddedLookup.apply(self._anchor, self, values, batch, (b, f, self.dim))
            self.timer.mark("gather")
            return out
        if self.training and torch.is_grad_enabled():
            leaf = values.requires_grad_()

            def capture(g: torch.Tensor) -> None:
                self._grads = (batch, g.detach())

            leaf.register_hook(capture)
            values = leaf
        if self.kernels == "triton":
            # backward: one zero-fill and one Triton scatter-add (relaxed atomics, row tiles)
            # instead of embedding_dense_backward's sort and segment sums
            out = gather_rows(values, batch.inv, "triton").view(b, f, self.dim)
        else:
            # F.embedding, not values[inv]: its backward reduces the gradient of repeated (hot)
            # ids by sorting, where index backward scatters with atomics that serialise on hot
            # rows (measured on an H200: 6.1 ms vs 0.1 ms per step at batch 8192 x 26 fields).
            out = F.embedding(batch.inv.view(b, f), values)
        self.timer.mark("gather")
        return out

    def _forward_local(self, ids: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` on the one-rank fast path: the step (through :class:`_LocalLookup`
        when training, so that the gradient comes back to it) returns ``[B, F, D]`` rows, one
        per occurrence in input order; no preprocessing, no gather."""
        err = _input_problem(ids)
        self._prefetched = None
        self.timer.start()
        if err is not None:  # (raises, after reporting any earlier bad batch)
            self._step_local(self._zeros_w[:0], op=_OP_FORWARD, error=err)
        if ids.device != self._ids_device:
            ids = ids.to(self.device)
        if self.training and torch.is_grad_enabled():
            out = _LocalLookup.apply(self._anchor, self, ids)
        else:
            out = self._step_local(ids, op=_OP_FORWARD, error=None)[0]
        self.timer.mark("gather")
        return out

    def flush(self) -> None:
        """(Collective) push every pending gradient and mirror delta so owners hold final values."""
        empty = torch.zeros(0, 1, dtype=torch.int64, device=self.device)
        if self._local:
            self._step_local(empty, op=_OP_FLUSH, error=None)
            return
        self._step(self._prepare(empty), op=_OP_FLUSH, error=None)

    def counters(self) -> dict[str, int]:
        """Cumulative counters (bytes by kind, rows by source, pushes)."""
        return self._merge(self._bytes_total, self._rows_host_total, self._rows_dev_total)

    def step_counters(self) -> dict[str, int]:
        """The last step's counters."""
        return self._merge(self._bytes_step, self._rows_host_step, self._rows_dev_step)

    def state_dict(  # type: ignore[override]
        self,
        *args: Any,
        destination: dict[str, Any] | None = None,
        prefix: str = "",
        keep_vars: bool = False,
    ) -> dict[str, Any]:
        """(Collective: flushes first) ``{"ids", "weight", "opt_state"}`` of the rows this rank owns."""
        self.flush()
        sd = {
            "ids": self.stored_ids[: self.n_own].cpu().clone(),
            "weight": self.weight[: self.n_own].cpu().clone(),
            "opt_state": self.opt_state[: self.n_own].cpu().clone(),
        }
        if destination is None:
            return sd
        destination.update({prefix + k: v for k, v in sd.items()})
        return destination

    def load_state_dict(
        self, sd: dict[str, torch.Tensor], strict: bool = True, assign: bool = False
    ) -> Any:  # type: ignore[override]
        """Load rows by global id from the union of any ranks' state dicts (any world size / plan).

        Every stored row (owned and mirrored) takes its saved value; versions restart at 0 on all
        ranks, so mirrors start in sync. Pending gradients are dropped."""
        ids = torch.as_tensor(sd["ids"]).to(torch.int64).reshape(-1)
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.num_rows):
            raise ValueError(f"state dict holds row ids outside [0, {self.num_rows})")
        order = torch.argsort(ids)
        sorted_ids = ids[order]
        want = self.stored_ids.cpu()
        pos = torch.searchsorted(sorted_ids, want).clamp(max=max(ids.numel() - 1, 0))
        found = (
            (sorted_ids[pos] == want) if ids.numel() else torch.zeros_like(want, dtype=torch.bool)
        )
        if not bool(found.all()):
            missing = want[~found]
            raise ValueError(
                f"state dict lacks {missing.numel()} of the {want.numel()} rows rank {self.env.rank} "
                f"stores (first missing id {int(missing[0])}); pass the union of all ranks' dicts"
            )
        src = order[pos]
        weight = torch.as_tensor(sd["weight"])
        if weight.shape != (ids.numel(), self.dim):
            raise ValueError(
                f"state dict weight has shape {tuple(weight.shape)}, expected ({ids.numel()}, {self.dim})"
            )
        self.weight.copy_(weight[src].to(self.device))
        if self.opt.state_width:
            self.opt_state.copy_(torch.as_tensor(sd["opt_state"])[src].to(self.device))
        self.version.zero_()
        self.pending.zero_()
        self.grad_acc.zero_()
        self.delta_acc.zero_()
        self._grads = None
        return None

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # Called when a parent module loads a state dict containing this table.
        keys = ("ids", "weight", "opt_state")
        if all(prefix + k in state_dict for k in keys):
            self.load_state_dict({k: state_dict[prefix + k] for k in keys})

    def extra_repr(self) -> str:
        return (
            f"num_rows={self.num_rows}, dim={self.dim}, rank={self.env.rank}/{self.env.world_size}, "
            f"owned={self.n_own}, mirrors={self.n_mir}, bound={self.bound}, optimizer={self.opt.name}, "
            f"kernels={self.kernels}, replies={self.replies}"
        )

    # ------------------------------------------------------------------ one step
    def _merge(
        self, byte_counts: dict[str, int], rows_host: dict[str, int], rows_dev: torch.Tensor
    ) -> dict[str, int]:
        out = dict(byte_counts)
        fresh, stale_ok, refreshed, deferred, owned_dev = (int(v) for v in rows_dev.tolist())
        out["rows_owned"] = rows_host["owned"] + owned_dev
        out["rows_mirror_fresh"] = fresh
        out["rows_mirror_stale_ok"] = stale_ok
        out["rows_remote"] = rows_host["not_stored"] + refreshed
        out["rows_mirror_refreshed"] = refreshed
        out["pushes_deferred"] = deferred
        out["rows_requested"] = sum(out[f"rows_{k}"] for k in ROW_KINDS)
        return out

    def _prep_new(self, ids: torch.Tensor) -> _Prep:
        """:meth:`_prepare`, into a :class:`PrepRing` slot with the padded exchange (up to
        four batch shapes; others, and eval batches, are prepared plainly)."""
        if self.exchange != "padded" or self._local or ids.dim() != 2 or not self.training:
            return self._prepare(ids)  # (eval steps take the exact exchange)
        key = tuple(ids.shape)
        ring = self._rings.get(key)
        if ring is None:
            if len(self._rings) >= 4:
                return self._prepare(ids)
            ring = PrepRing(key, self.device, self._prepare, graphs=self._graphs)
            self._rings[key] = ring
        prep, slot, static = ring.fill(ids)
        if static:  # (a replay returns the captured call's own _Prep: the same every time)
            prep.ring, prep.static, prep.source = slot, True, ids
            return prep
        return dataclasses.replace(prep, ring=slot, static=static, source=ids)

    def _prepare(self, ids: torch.Tensor) -> _Prep:
        """Unique ids in block order (see :class:`_Prep`); fixed-size ops only, no host sync."""
        w = self.env.world_size
        flat = ids.reshape(-1)
        n = flat.numel()
        # Clamped so that a bad id cannot index out of range before the step reports it.
        clamped = flat.clamp(0, self.num_rows - 1)
        bad = (clamped != flat).any()
        # Unique rows without sorting the ids: every occurrence's "leader" (one occurrence per
        # row, see _leaders); the leaders, keyed by block, are then ordered by one stable sort
        # of small int32 keys (non-leaders last, as padding). index_select, not advanced
        # indexing: one kernel, no index-tensor broadcasting.
        lead = self._leaders(clamped)
        ar = self._per_size("arange", n)
        key = torch.where(lead == ar, self.block_of.index_select(0, clamped), 3 * w)
        order = torch.argsort(key, stable=True)
        # Block sizes by binary search in the sorted keys (a bincount would sync on CUDA).
        starts = torch.searchsorted(key.index_select(0, order), self._arange_3w1)
        pos = torch.empty(n, dtype=torch.int32, device=ids.device).scatter_(0, order, ar)
        cnt = torch.zeros(n, dtype=torch.int64, device=ids.device).index_add_(
            0, lead, self._per_size("ones", n)
        )  # occurrences, at the leader
        return _Prep(
            ids=ids,
            bad=bad,
            u=clamped.index_select(0, order),
            cnt=cnt.index_select(0, order),
            slot=self.slot_of.index_select(0, clamped.index_select(0, order)).long(),
            inv=pos.index_select(0, lead),
            blocks=starts[1:] - starts[:-1],
            source=ids,
        )

    def _stage_mirrors(
        self, grads: tuple[_Batch, torch.Tensor] | None, push_all: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """Write rule, device part: mirrors of the last batch apply their gradient locally and
        accumulate it; returns ``(due mask [n_mir] or None, due rows per owner [w],
        deferred)`` where due = ``pending > bound`` (any pending at flush/eval)."""
        if grads is not None and grads[0].n_mir:
            batch, grad = grads
            m0, m1 = batch.n_own, batch.n_own + batch.n_mir
            ms, gm = batch.slot[m0:m1], grad[m0:m1]
            mi = ms - self.n_own
            sw = self.opt.state_width
            state = self.opt_state.index_select(0, ms) if sw else self.opt_state
            delta, state = self.opt.local_step(state, gm)
            if sw:
                self.opt_state.index_copy_(0, ms, state)
            scatter_add_rows(self.weight, ms, delta, backend=self.kernels)
            index_add_rows(self.delta_acc, mi, delta)
            index_add_rows(self.grad_acc, mi, gm)
            index_add_rows(self.pending, mi, batch.cnt[m0:m1])
        if self.n_mir == 0:
            return None, self._zeros_w, self._zeros_w[0]
        due = self.pending > (0 if push_all else self.bound)
        deferred = ((self.pending > 0) & ~due).sum()
        return due, self.due_per_owner(due), deferred

    def due_per_owner(self, due: torch.Tensor) -> torch.Tensor:
        """``[w]`` the number of due mirrors per owner (``due [n_mir]`` bool): mirrors are
        stored grouped by owner, so these are differences of one prefix sum."""
        c = torch.cat([self._zeros_w[:1], torch.cumsum(due, 0)])
        return c.index_select(0, self._mir_end) - c.index_select(0, self._mir_start)

    def _per_size(self, kind: str, n: int) -> torch.Tensor:
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

    def _leaders(self, slots: torch.Tensor) -> torch.Tensor:
        """For every occurrence (a global row id), the position of its row's "leader"
        occurrence (int32). One scatter of positions into a per-row map picks a winner per row
        (any one: CUDA makes no promise which); reading the map back gives every occurrence of
        a row the same leader, so ``lead == arange`` marks exactly one occurrence per row."""
        if self._pos_map32 is None:
            self._pos_map32 = torch.empty(self.num_rows, dtype=torch.int32, device=self.device)
        ar = self._per_size("arange", slots.numel())
        self._pos_map32.index_copy_(0, slots, ar)
        return self._pos_map32.index_select(0, slots)

    def _const_cols(self, bound: int, op: int, padded: bool) -> torch.Tensor:
        """The bound / audit / operation / padded columns of sizes table 1 as one ``[w, 4]``
        tensor (``unbind(1)`` gives the columns), made once per value (fill kernels per step
        saved)."""
        key = (bound, op, padded)
        cols = self._const_cache.get(key)
        if cols is None:
            row = [bound, int(self._send_all), op, int(padded)]
            cols = torch.tensor([row] * self.env.world_size, dtype=torch.int64)
            cols = self._const_cache[key] = cols.to(self.device)
        return cols

    def _check_peers(self, theirs: list[list[int]], op: int) -> None:
        bad = [i for i, row in enumerate(theirs) if row[_STATUS] != 0]
        if bad:
            raise PeerFailedError(
                f"rank {self.env.rank}: rank(s) {bad} reported bad input to the embedding "
                f"lookup; aborting this step (see their error)"
            )
        ops = [row[_OP] for row in theirs]
        if any(o != op for o in ops):
            names = {i: _OP_NAMES.get(o, str(o)) for i, o in enumerate(ops)}
            raise PeerFailedError(
                f"rank {self.env.rank}: ranks disagree on the collective call ({names}); every "
                f"rank must call forward (an empty batch when it has none left) or flush together"
            )

    def _drain_bad_checks(self, *, wait: bool) -> None:
        """World-1, CUDA: read the out-of-range flags of earlier batches whose device->host
        copy is done (all of them with ``wait``, at flush; the oldest when the ring is full),
        so the host never waits for the device; the steps in between ran with the bad ids
        clamped into range, and the error names the batch it was."""
        ring = self._bad_ring
        while self._bad_checks and (
            wait
            or len(self._bad_checks) == _BAD_RING  # the ring is full: wait for the oldest
            or ring[1][self._bad_checks[0][0]].query()
        ):
            slot, ids = self._bad_checks.pop(0)
            ring[1][slot].synchronize()
            if bool(ring[0][slot]):
                self._bad_checks.clear()
                raise EmbeddingInputError(
                    f"rank {self.env.rank}: an earlier batch: {_range_error(ids, self.num_rows)}"
                )

    def _check_local(self, ids: torch.Tensor) -> None:
        """World-1: this batch's out-of-range flag (set by :func:`mark_local`). On CPU it is
        read at once (no device to wait for; cleared before raising: the step stops before
        :func:`take_local` would clear it). On CUDA it is copied to pinned memory and read by
        a later :meth:`_drain_bad_checks`."""
        if self.device.type != "cuda":
            if int(self._bad_flag):
                self._bad_flag.zero_()
                raise EmbeddingInputError(
                    f"rank {self.env.rank}: {_range_error(ids, self.num_rows)}"
                )
            return
        ring = self._bad_ring
        if ring is None:
            ring = (
                torch.zeros(_BAD_RING, dtype=torch.int32, pin_memory=True),
                [torch.cuda.Event() for _ in range(_BAD_RING)],
            )
            self._bad_ring = ring
        slot = self._bad_next
        self._bad_next = (slot + 1) % _BAD_RING
        ring[0][slot : slot + 1].copy_(self._bad_flag, non_blocking=True)
        ring[1][slot].record(current_stream(self.device))
        self._bad_checks.append((slot, ids))

    def _step_local(
        self, ids: torch.Tensor, *, op: int, error: str | None
    ) -> tuple[torch.Tensor, _LocalBatch]:
        """One step on one rank (the fast path; see the module docstring): apply the last
        step's gradient (one row per occurrence), then gather this batch's rows (``ids
        [B, F]`` on the device -> ``[B, F, D]``). No host sync, no sort; besides the update,
        two fused kernels (:func:`mark_local`: clamp, range flag, leader map;
        :func:`take_local`: rows, leaders, distinct-row count). Written for the host: every
        tensor op and attribute write here costs host time on each step."""
        self.timer.mark("unique")
        if self._bad_checks:
            self._drain_bad_checks(wait=op == _OP_FLUSH)
        if error:
            raise EmbeddingInputError(f"rank {self.env.rank}: {error}")
        n = ids.numel()
        counts = self._local_counts
        pos_map = self._pos_map32
        if n:
            if pos_map is None:
                pos_map = torch.empty(self.num_rows, dtype=torch.int32, device=self.device)
                self._pos_map32 = pos_map
            slots = mark_local(
                ids, pos_map, self._bad_flag, counts[0], self.num_rows, backend=self.kernels
            )
            self._check_local(ids)
        else:
            slots = ids
            counts[0].zero_()
        grads = self._grads
        if grads is not None:
            self._grads = None
            pb, pg = grads
            if pb.lead is None:  # (an empty batch)
                pass
            elif self.opt.name == "sgd":  # linear: every occurrence's gradient added directly
                self.opt.apply(self.weight, self.opt_state, pb.slot, pg)
            else:
                # Row sums at the leader occurrence, zeros elsewhere: ``padded`` then adds the
                # state once per row and a zero step at the non-leaders.
                # (a fresh contiguous buffer: the captured gradient may be an expanded view)
                d = self.dim
                gsum = torch.zeros(pb.lead.numel(), d, dtype=torch.float32, device=pg.device)
                scatter_add_rows(gsum, pb.lead, pg, backend=self.kernels)
                self.opt.apply(self.weight, self.opt_state, pb.slot.reshape(-1), gsum, padded=True)
        self.timer.mark("update")
        if n:
            values, lead = take_local(
                self.weight, slots, pos_map, self._bad_flag, counts[0], counts[1],
                backend=self.kernels,
            )  # fmt: skip
        else:
            values, lead = self.weight.new_zeros(*ids.shape, self.dim), None
        # Counters: nothing is sent on one rank, so the step's byte counts are one constant
        # dict (the distinct rows were counted on the device by take_local).
        self._bytes_step = self._local_bytes_step
        self._bytes_total["steps"] += 1
        return values, _LocalBatch(slots, lead)

    def _step(self, prep: _Prep, *, op: int, error: str | None) -> tuple[torch.Tensor, _Batch]:
        env, dev, r = self.env, self.device, self.env.rank
        evaluating = op == _OP_FLUSH or not self.training
        bound = 0 if evaluating else self.bound
        self.timer.mark("unique")
        grads, self._grads = self._grads, None
        padded = self.exchange == "padded" and not evaluating and error is None
        st = self._static
        presync = (
            padded and st is not None and grads is not None and grads[0].static is st
            and grads[0].prep is not None and prep.ring >= 0
            and grads[0].prep.ring == prep.ring ^ 1 and min(st.cap.u, st.cap.n) > 0
            and grads[0].prep.ids.shape == prep.ids.shape and prep.u.numel() == st.cap.n
            and isinstance(grads[1], _Occurrences) and grads[1].grad.shape[0] == st.cap.n
            and st.current  # (its graphs hold the bound and the learning rate)
        )  # fmt: skip
        if presync:  # the step up to the sizes exchange in fixed shapes (a graph on CUDA)
            assert st is not None and grads is not None and grads[0].prep is not None
            host = st.presync(grads[0].prep, prep, self._const_cols(bound, op, True), grads[1].grad)
            grads = (grads[0], st.grad[: grads[0].u.numel()])  # (summed by the segment)
            self.padded_presyncs += 1
            self.timer.mark("update")
            table, theirs_dev = st.sz_mine, st.sz_theirs
            return self._after_sizes(prep, grads, op, error, evaluating, padded, table, theirs_dev,
                                     host, None, True)  # fmt: skip
        grads = self._summed(grads)
        due, ndue, deferred = self._stage_mirrors(grads, push_all=evaluating)
        own_done = False
        if padded and grads is not None and grads[0].n_own:
            # SGD is linear: the last batch's own rows can be applied now, before the pushes
            # (the padded segments apply only those); the exact path then skips them.
            pb, pg = grads
            o_slot = pb.slot[: pb.n_own]
            self.opt.apply(self.weight, self.opt_state, o_slot, pg[: pb.n_own])
            index_add_rows(self.version, o_slot, pb.cnt[: pb.n_own])
            own_done = True
        self.timer.mark("update")

        # ---- sizes exchange 1: per-peer counts + status (bad ids: a device flag), bound,
        # audit flag, operation, this rank's own block size, its largest per-peer query and
        # push counts and the padded-exchange flag; ONE device->host copy.
        bl = prep.blocks
        n_push = ndue + (self._nqr_dev(grads[0]) if grads is not None else 0)
        status = prep.bad.long() if error is None else torch.ones((), dtype=torch.int64, device=dev)
        table = sizes.sizes_table(bl, n_push, ndue, status, self._const_cols(bound, op, padded).unbind(1), r)
        theirs_dev, host = exchange_sizes(env, table, "embedding size exchange 1")
        return self._after_sizes(prep, grads, op, error, evaluating, padded, table, theirs_dev,
                                 host, (due, ndue, deferred), own_done)  # fmt: skip

    def _nqr_dev(self, batch: _Batch) -> torch.Tensor:
        """``batch.nqr`` on the device."""
        if batch.nqr_dev is None:
            batch.nqr_dev = torch.tensor(batch.nqr, dtype=torch.int64, device=self.device)
        return batch.nqr_dev

    def _summed(self, grads: Any) -> tuple[_Batch, torch.Tensor] | None:
        """``grads`` with a padded step's per-occurrence gradient (:class:`_Occurrences`)
        summed per unique row into its buffer, eagerly (outside the pre-sync graph)."""
        if grads is None or not isinstance(grads[1], _Occurrences):
            return grads
        pb = grads[0]
        assert pb.static is not None
        return pb, pb.static.sum_grad(pb.inv, grads[1].grad, pb.u.numel())

    def _keep_unapplied(self, grads: tuple[_Batch, torch.Tensor] | None, own_done: bool) -> None:
        """A step that stops at the sizes exchange (bad input here or on a peer) has staged
        the last batch's mirrors (and, ``own_done``, applied its own rows); the rest, its own
        rows and its rows not stored here (pushed at the next step), is kept as the pending
        gradient, so a caught error loses nothing (as with one rank or the reference)."""
        if grads is None:
            return
        pb, pg = grads
        own, r0 = (0 if own_done else pb.n_own), pb.n_own + pb.n_mir
        kept = _Batch(
            u=torch.cat([pb.u[:own], pb.u[r0:]]),
            cnt=torch.cat([pb.cnt[:own], pb.cnt[r0:]]),
            slot=torch.cat([pb.slot[:own], pb.slot[r0:]]),
            inv=pb.inv,
            n_own=own,
            n_mir=0,
            nqr=pb.nqr,
            nqr_dev=self._nqr_dev(pb).clone(),
        )
        self._grads = (kept, torch.cat([pg[:own], pg[r0:]]))

    def _after_sizes(
        self,
        prep: _Prep,
        grads: tuple[_Batch, torch.Tensor] | None,
        op: int,
        error: str | None,
        evaluating: bool,
        padded: bool,
        table: torch.Tensor,
        theirs_dev: torch.Tensor,
        host: torch.Tensor,
        staged: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None,
        own_done: bool,
    ) -> tuple[torch.Tensor, _Batch]:
        """The step after sizes exchange 1 (``host``: both tables on the CPU); ``staged``:
        what :meth:`_stage_mirrors` returned, ``None`` when the padded pre-sync segment
        staged the last batch (then computed here if the exact exchange follows)."""
        env, dev, d, w = self.env, self.device, self.dim, self.env.world_size
        sw = self.opt.state_width
        bound = 0 if evaluating else self.bound
        mine_l, theirs_l = host[0].tolist(), host[1].tolist()
        if error is None and mine_l[0][_STATUS]:
            error = _range_error(prep.ids, self.num_rows)
        try:
            if error:
                raise EmbeddingInputError(f"rank {env.rank}: {error}")
            self._check_peers(theirs_l, op)
        except (EmbeddingInputError, PeerFailedError):
            self._keep_unapplied(grads, own_done)
            raise
        nqm = [row[_NQM] for row in mine_l]
        nqr = [row[_NQR] for row in mine_l]
        npush = [row[_NP] for row in mine_l]
        ndue_l = [row[_NDUE] for row in mine_l]
        nqm_in = [row[_NQM] for row in theirs_l]
        nqr_in = [row[_NQR] for row in theirs_l]
        np_in = [row[_NP] for row in theirs_l]
        n_o = mine_l[0][_NOWN]
        batch = _Batch(
            u=prep.u[: n_o + sum(nqm) + sum(nqr)],
            cnt=prep.cnt[: n_o + sum(nqm) + sum(nqr)],
            slot=prep.slot[: n_o + sum(nqm) + sum(nqr)],
            inv=prep.inv,
            n_own=n_o,
            n_mir=sum(nqm),
            nqr=nqr,
            # (the pre-sync path's table is a reused buffer: this batch keeps its own copy)
            nqr_dev=None if staged is None else table[:, _NQR],
        )
        if padded and all(row[_PADDED] for row in theirs_l):
            values = self._step_padded(
                prep, batch, grads, table, theirs_dev, mine_l, theirs_l, loaded=staged is None
            )
            return values, batch
        if staged is None:  # (a peer takes the exact exchange this step)
            staged = self._stage_mirrors(None, push_all=evaluating)
        due, ndue, deferred = staged

        # ---- pushes: the last batch's rows not stored here + mirrors due (grouped by owner)
        tot_due = sum(ndue_l)
        di = compact(due, tot_due) if due is not None else self._zeros_w[:0]
        d_ids = self.stored_ids.index_select(0, di + self.n_own)
        d_cnt = self.pending.index_select(0, di)
        d_grad = self.grad_acc.index_select(0, di)
        if tot_due:
            if self.opt.exact_mirror:
                # The mirror's value already holds exactly what the owner is about to apply.
                index_add_rows(self.version, di + self.n_own, d_cnt)
            self.pending.index_fill_(0, di, 0)
            self.grad_acc.index_fill_(0, di, 0.0)
            self.delta_acc.index_fill_(0, di, 0.0)
        if grads is not None:
            pb, pg = grads
            r0 = pb.n_own + pb.n_mir
            pr_ids, pr_cnt, pr_grad, pr_n = pb.u[r0:], pb.cnt[r0:], pg[r0:], pb.nqr
        else:
            pr_ids, pr_cnt, pr_grad, pr_n = d_ids[:0], d_cnt[:0], d_grad[:0], [0] * w

        # ---- payload exchange 1, per peer: query ids (mirrors, then not stored), mirror
        # versions, push ids, push counts, push gradients; written once, in peer order.
        m0, m1 = n_o, n_o + batch.n_mir
        q_mv = self.version.index_select(0, batch.slot[m0:m1])
        parts = [
            _f32(batch.u[m0:m1]).split([2 * k for k in nqm]),
            _f32(batch.u[m1:]).split([2 * k for k in nqr]),
            _f32(q_mv).split([2 * k for k in nqm]),
            _f32(pr_ids).split([2 * k for k in pr_n]),
            _f32(d_ids).split([2 * k for k in ndue_l]),
            _f32(pr_cnt).split([2 * k for k in pr_n]),
            _f32(d_cnt).split([2 * k for k in ndue_l]),
            pr_grad.reshape(-1).split([d * k for k in pr_n]),
            d_grad.reshape(-1).split([d * k for k in ndue_l]),
        ]
        send = _join([p[j] for j in range(w) for p in parts], dev)
        recv = exchange_payload(
            env,
            send,
            [4 * a + 2 * b + (4 + d) * c for a, b, c in zip(nqm, nqr, npush, strict=True)],
            [4 * a + 2 * b + (4 + d) * c for a, b, c in zip(nqm_in, nqr_in, np_in, strict=True)],
            "embedding exchange 1",
        )
        sizes = [
            x
            for a, b, c in zip(nqm_in, nqr_in, np_in, strict=True)
            for x in (2 * a, 2 * b, 2 * a, 2 * c, 2 * c, d * c)
        ]
        pieces = recv.split(sizes)
        r_mids, r_rids, r_mv, r_pids, r_pcnt = (_i64(_join(pieces[k::6], dev)) for k in range(5))
        r_pgrad = _join(pieces[5::6], dev).view(-1, d)
        self.timer.mark("exchange")

        # ---- owners apply own + pushed gradients: one optimizer update per row per step
        self._apply_owned(None if own_done else grads, r_pids, r_pcnt, r_pgrad)
        self.timer.mark("update")
        n_q, n_p, n_qin, n_pin = (
            sum(nqm) + sum(nqr),
            sum(npush),
            sum(nqm_in) + sum(nqr_in),
            sum(np_in),
        )
        self._count_bytes(
            sent={
                "ids": 8 * (n_q + n_p),
                "versions": 8 * (sum(nqm) + n_p),
                "gradients": 4 * d * n_p,
            },
            recv={
                "ids": 8 * (n_qin + n_pin),
                "versions": 8 * (sum(nqm_in) + n_pin),
                "gradients": 4 * d * n_pin,
            },
            reset=True,
        )
        self._bytes_step["pushes_sent"] = n_p
        self._bytes_total["pushes_sent"] += n_p
        self._rows_host_step = {"owned": n_o, "not_stored": sum(nqr)}
        if op == _OP_FLUSH:
            z = self._zeros_w[0]
            self._rows_dev_step = torch.stack([z, z, z, deferred.to(torch.int64), z])
            self._accumulate_rows()
            return torch.zeros(0, d, device=dev), batch

        # ---- owners answer: lag (int32) for every mirror query; value + state + version for
        # mirrors beyond the requester's bound (all in audit mode) and every not-stored query.
        nm_in = sum(nqm_in)
        m_slot = self.slot_of.index_select(0, r_mids).long()
        lag = self.version.index_select(0, m_slot) - r_mv
        self.timer.mark("gather")
        if all(row[_SEND_ALL] for row in theirs_l):
            # Every rank (this one's own row included) asked for a value per query: the reply
            # sizes are the query counts, which every rank knows from exchange 1 (the same
            # decision on every rank), so there is no second size exchange and no selection
            # of the stale queries.
            k_out_l = [a + b for a, b in zip(nqm_in, nqr_in, strict=True)]
            k_in_l = [a + b for a, b in zip(nqm, nqr, strict=True)]
            rows_m = m_slot.split(nqm_in)
        else:
            src = torch.repeat_interleave(
                torch.arange(w, device=dev), theirs_dev[:, _NQM], output_size=nm_in
            )
            # Per query, its requester's bound (a requester that wants every value, e.g. in
            # audit mode, gets the int64 minimum: every lag, even a negative one, the
            # violation the audit must see, exceeds it).
            thr = torch.where(theirs_dev[:, _SEND_ALL] > 0, _I64_MIN, theirs_dev[:, _BOUND])
            need = lag > thr.index_select(0, src)
            cn = torch.cat([self._zeros_w[:1], torch.cumsum(need, 0)])
            ends = torch.cumsum(theirs_dev[:, _NQM], 0)
            k_out = (
                cn.index_select(0, ends)
                - cn.index_select(0, ends - theirs_dev[:, _NQM])
                + theirs_dev[:, _NQR]
            )
            _, host2 = exchange_sizes(env, k_out[:, None], "embedding size exchange 2")
            k_out_l, k_in_l = host2[0, :, 0].tolist(), host2[1, :, 0].tolist()
            km_out = [k - a for k, a in zip(k_out_l, nqr_in, strict=True)]
            sel = compact(need, sum(km_out))
            rows_m = m_slot.index_select(0, sel).split(km_out)
        rows_r = self.slot_of.index_select(0, r_rids).long().split(nqr_in)
        rows = _join([x for j in range(w) for x in (rows_m[j], rows_r[j])], dev, torch.int64)
        vals = take_rows(self.weight, rows, backend=self.kernels)
        extra = [_f32(self.version.index_select(0, rows)).view(-1, 2)]
        if sw:
            extra.insert(0, self.opt_state.index_select(0, rows)[:, None])
        ext = torch.cat(extra, dim=1)
        lag32 = _f32(lag.clamp(-_I32_MAX, _I32_MAX).to(torch.int32))
        parts2 = [
            lag32.split(nqm_in),
            vals.reshape(-1).split([d * k for k in k_out_l]),
            ext.reshape(-1).split([(sw + 2) * k for k in k_out_l]),
        ]
        send2 = _join([p[j] for j in range(w) for p in parts2], dev)
        recv2 = exchange_payload(
            env,
            send2,
            [a + (d + sw + 2) * k for a, k in zip(nqm_in, k_out_l, strict=True)],
            [a + (d + sw + 2) * k for a, k in zip(nqm, k_in_l, strict=True)],
            "embedding exchange 2",
        )
        km_in = [k - a for k, a in zip(k_in_l, nqr, strict=True)]
        sizes2 = [
            x for a, k, km in zip(nqm, k_in_l, km_in, strict=True)
            for x in (a, d * km, d * (k - km), (sw + 2) * km, (sw + 2) * (k - km))
        ]  # fmt: skip
        p2 = recv2.split(sizes2)
        q_lag = _join(p2[0::5], dev).view(torch.int32).long()
        mir_vals = _join(p2[1::5], dev).view(-1, d)
        rem_vals = _join(p2[2::5], dev).view(-1, d)
        mir_ext = _join(p2[3::5], dev).view(-1, sw + 2)
        rem_ext = _join(p2[4::5], dev).view(-1, sw + 2)
        self.timer.mark("exchange")
        self._count_bytes(
            sent={"versions": 4 * nm_in + 8 * sum(k_out_l), "values": 4 * (d + sw) * sum(k_out_l)},
            recv={"versions": 4 * sum(nqm) + 8 * sum(k_in_l), "values": 4 * (d + sw) * sum(k_in_l)},
            reset=False,
        )
        values = self._gather(
            batch, q_lag, mir_vals, mir_ext, rem_vals, rem_ext, sum(km_in), bound, deferred
        )
        return values, batch

    def _step_padded(
        self,
        prep: _Prep,
        batch: _Batch,
        grads: tuple[_Batch, torch.Tensor] | None,
        table: torch.Tensor,
        theirs_dev: torch.Tensor,
        mine_l: list[list[int]],
        theirs_l: list[list[int]],
        *,
        loaded: bool,
    ) -> torch.Tensor:
        """The rest of a training step with fixed-capacity payloads (see
        :mod:`hetgmp.embedding.static_exchange`); every rank takes it together (the
        ``_PADDED`` column) with the same capacities (from every rank's maxima)."""
        n, nu = prep.u.numel(), batch.u.numel()
        old = self._static.cap if self._static is not None else None
        cap = Capacity(
            q=grow(old.q if old else 0, max(row[_MAXQ] for row in theirs_l)),
            p=grow(old.p if old else 0, max(row[_MAXP] for row in theirs_l)),
            u=min(n, grow(old.u if old and old.n == n else 0, nu)),
            n=n,
        )
        if cap != old or not self._static.current:
            new = StaticExchange(self, cap, graphs=self._graphs, comm=self._padded_comm())
            if loaded:  # the pre-sync segment wrote the inputs into the old buffers
                assert self._static is not None
                new.adopt(self._static)
            self._static = new
            self.padded_rebuilds.append(cap)
        st = self._static
        assert st is not None
        if not loaded:
            pushes = None
            if grads is not None:
                pb, pg = grads
                r0 = pb.n_own + pb.n_mir
                pushes = (pb.u[r0:], pb.cnt[r0:], pg[r0:], self._nqr_dev(pb))
            st.load(prep.u, prep.slot, prep.blocks, table, theirs_dev, pushes)
        values = st.run()
        batch.prep, batch.static = prep, st
        self.timer.mark("exchange")
        # Bytes actually sent: the padded buffers, to every other rank.
        self._count_bytes(sent=st.bytes_per_step, recv=st.bytes_per_step, reset=True)
        n_p = sum(row[_NP] for row in mine_l)
        self._bytes_step["pushes_sent"] = n_p
        self._bytes_total["pushes_sent"] += n_p
        self._rows_host_step = {"owned": batch.n_own, "not_stored": sum(batch.nqr)}
        for k, v in self._rows_host_step.items():  # (the device counts were added in-graph)
            self._rows_host_total[k] += v
        self._rows_dev_step = st.rows_step
        return values[:nu]

    def release_graphs(self) -> None:
        """Drop every CUDA graph this table captured (after the device is done with them);
        later steps capture again. Called by :func:`hetgmp.comm.launch.shutdown` (through
        ``env.closers``) before the process groups are destroyed."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self._static is not None:
            self._static.release()
        for ring in self._rings.values():
            ring.release()

    def _padded_comm(self) -> DistEnv:
        """The env whose group the padded exchange's collectives use (every rank calls this at
        its first padded step, together). With CUDA graphs on NCCL and ``graph_collectives``:
        a process group of its own, so the all-to-alls can be captured inside the graphs
        (replays bypass a process group's per-call host bookkeeping, so a captured collective
        must never share its communicator with eager calls of the exact path); else the
        embedding's env."""
        if self._comm_padded is None:
            env = self.env
            if (
                self._graphs
                and self._graph_collectives
                and env.backend == "nccl"
                and env.group is not None
            ):
                group = env.groups.get("padded")
                if group is None:  # (one for every table on this env: see DistEnv.groups)
                    ranks = dist.get_process_group_ranks(env.group)
                    group = env.groups["padded"] = dist.new_group(ranks, backend="nccl")
                self._comm_padded = dataclasses.replace(env, group=group)
                # the graphs must go before the group does (hetgmp.comm.launch.shutdown)
                _GraphReleaser.register(env, self)
            else:
                self._comm_padded = env
        return self._comm_padded

    def _apply_owned(
        self,
        grads: tuple[_Batch, torch.Tensor] | None,
        r_pids: torch.Tensor,
        r_pcnt: torch.Tensor,
        r_pgrad: torch.Tensor,
    ) -> None:
        """Owned rows of the last batch (unique) + rows pushed by peers (may repeat, may overlap)."""
        if grads is not None:
            pb, pg = grads
            o_slot, o_cnt, o_grad = pb.slot[: pb.n_own], pb.cnt[: pb.n_own], pg[: pb.n_own]
        else:
            o_slot, o_cnt, o_grad = r_pids[:0], r_pcnt[:0], r_pgrad[:0]
        p_slot = self.slot_of.index_select(0, r_pids).long()
        if self.opt.name == "sgd" or p_slot.numel() == 0:
            # SGD is linear: adding each contribution equals adding their sum (up to float
            # summation order), so pushed rows need no merging.
            self.opt.apply(self.weight, self.opt_state, o_slot, o_grad)
            index_add_rows(self.version, o_slot, o_cnt)
            if p_slot.numel():
                self.opt.apply(self.weight, self.opt_state, p_slot, r_pgrad)  # SGD: repeats ok
                index_add_rows(self.version, p_slot, r_pcnt)
            return
        # Adagrad: one update per row of the summed gradient. Give every distinct row a
        # "leader" entry through a per-slot position map (own rows win, then one push per
        # row), sum into the leaders, and apply at every entry with the leader's sums: the
        # duplicates write identical state and add a zero step.
        m0, p = o_slot.numel(), p_slot.numel()
        if self._pos_map is None:
            self._pos_map = torch.empty(self.n_own, dtype=torch.int64, device=self.device)
        ar = torch.arange(m0 + p, device=self.device)
        self._pos_map.index_copy_(0, p_slot, ar[m0:])
        self._pos_map.index_copy_(0, o_slot, ar[:m0])
        lead = torch.cat([ar[:m0], self._pos_map[p_slot]])
        slots = torch.cat([o_slot, p_slot])
        gsum = torch.zeros(m0 + p, self.dim, device=self.device).index_add_(
            0, lead, torch.cat([o_grad, r_pgrad])
        )
        csum = torch.zeros(m0 + p, dtype=torch.int64, device=self.device).index_add_(
            0, lead, torch.cat([o_cnt, r_pcnt])
        )
        is_lead = lead == ar
        self.opt.apply_merged(self.weight, self.opt_state, slots, gsum[lead], is_lead)
        index_add_rows(self.version, slots, csum[lead] * is_lead)

    def _gather(
        self,
        batch: _Batch,
        q_lag: torch.Tensor,
        mir_vals: torch.Tensor,
        mir_ext: torch.Tensor,
        rem_vals: torch.Tensor,
        rem_ext: torch.Tensor,
        n_sent_mir: int,
        bound: int,
        deferred: torch.Tensor,
    ) -> torch.Tensor:
        """Refresh mirrors beyond the bound, then the batch's values in block order."""
        d, sw = self.dim, self.opt.state_width
        n_o, n_m = batch.n_own, batch.n_mir
        ms = batch.slot[n_o : n_o + n_m]
        refresh = q_lag > bound
        if n_sent_mir:
            # The owner sent values for exactly the refreshed mirrors (all mirrors in audit
            # mode and with replies="all"), in block order.
            rs = ms if self._send_all else ms.index_select(0, compact(refresh, n_sent_mir))
            ov = _i64(mir_ext[:, sw:])
            new = mir_vals + self.delta_acc[rs - self.n_own]  # + own unpushed updates
            if self._send_all:  # every mirror got a value; only the stale ones take it
                keep = refresh[:, None]
                new = torch.where(keep, new, self.weight[rs])
                ov = torch.where(refresh, ov, self.version[rs])
            self.weight.index_copy_(0, rs, new)
            self.version.index_copy_(0, rs, ov)
            if sw:
                st = mir_ext[:, 0]
                if self._send_all:
                    st = torch.where(refresh, st, self.opt_state[rs])
                self.opt_state.index_copy_(0, rs, st)
        values = torch.empty(batch.u.numel(), d, device=self.device)
        take_rows(
            self.weight, batch.slot[: n_o + n_m], out=values[: n_o + n_m], backend=self.kernels
        )
        values[n_o + n_m :] = rem_vals
        self._rows_dev_step = torch.stack(
            [
                (q_lag == 0).sum(),
                ((q_lag > 0) & (q_lag <= bound)).sum(),
                refresh.sum(),
                deferred.to(torch.int64),
                self._zeros_w[0],
            ]
        )
        self._accumulate_rows()
        if self.audit:
            self._record_audit(
                batch, q_lag, refresh, mir_vals, mir_ext, rem_vals, rem_ext, values, bound
            )
        return values

    def _accumulate_rows(self) -> None:
        self._rows_dev_total += self._rows_dev_step
        for k, v in self._rows_host_step.items():
            self._rows_host_total[k] += v

    def _record_audit(
        self,
        batch: _Batch,
        q_lag: torch.Tensor,
        refresh: torch.Tensor,
        mir_vals: torch.Tensor,
        mir_ext: torch.Tensor,
        rem_vals: torch.Tensor,
        rem_ext: torch.Tensor,
        values: torch.Tensor,
        bound: int,
    ) -> None:
        """Test mode: check and record every queried row's lag (host syncs are fine here)."""
        sw = self.opt.state_width
        n_o, n_m = batch.n_own, batch.n_mir
        n_r = batch.u.numel() - n_o - n_m
        if bool((q_lag < 0).any()):
            raise StalenessViolation(
                f"rank {self.env.rank}: a mirror read lags its owner by {int(q_lag.max())} "
                f"(min {int(q_lag.min())}) with bound {bound}"
            )
        is_mirror = torch.cat(
            [torch.ones(n_m, dtype=torch.bool), torch.zeros(n_r, dtype=torch.bool)]
        ).to(self.device)
        zeros_r = torch.zeros(n_r, dtype=torch.int64, device=self.device)
        ext = torch.cat([mir_ext, rem_ext])
        self.last_audit = {
            "ids": batch.u[n_o:].clone(),
            "is_mirror": is_mirror,
            "refreshed": torch.cat([refresh, zeros_r.bool()]),
            "lag": torch.cat([torch.where(refresh, 0, q_lag), zeros_r]),
            "owner_version": _i64(ext[:, sw:]),
            "owner_value": torch.cat([mir_vals, rem_vals]).clone(),
            "used_value": values[n_o:].clone(),
            "pending": torch.cat([self.pending[batch.slot[n_o : n_o + n_m] - self.n_own], zeros_r]),
        }

    def _count_bytes(self, *, sent: dict[str, int], recv: dict[str, int], reset: bool) -> None:
        if reset:
            self._bytes_step = {k: 0 for k in self._bytes_step}
            self._bytes_step["steps"] = 1
            self._bytes_total["steps"] += 1
        for prefix, part in (("bytes_sent_", sent), ("bytes_recv_", recv)):
            for k, v in part.items():
                self._bytes_step[prefix + k] += v
                self._bytes_total[prefix + k] += v


_I32_MAX = 2**31 - 1
_BAD_RING = 16  # world-1 CUDA bad-id checks in flight at most (then the oldest is waited for)
_I64_MIN = -(2**63)


def _input_problem(ids: object) -> str | None:
    """Type / dtype / shape problem of a batch (host-side facts, no device access)."""
    if not isinstance(ids, torch.Tensor):
        return f"ids must be a torch.Tensor, got {type(ids).__name__}"
    if ids.dtype != torch.int64:
        return f"ids must be int64 (torch.long), got {ids.dtype}"
    if ids.dim() != 2:
        return f"ids must have shape [batch, fields], got {tuple(ids.shape)}"
    return None


def _range_error(ids: torch.Tensor, num_rows: int) -> str:
    """The message for a batch whose device flag said an id is out of range (error path only)."""
    lo, hi = torch.stack([ids.min(), ids.max()]).tolist()
    bad = lo if lo < 0 else hi
    return f"id {bad} is outside [0, {num_rows}) (table has {num_rows} rows)"


def _f32(x: torch.Tensor) -> torch.Tensor:
    """The bytes of an int64/int32/float32 tensor as a flat float32 tensor (no copy)."""
    if x.dim() != 1 or not x.is_contiguous():  # host-side checks: no op dispatched
        x = x.contiguous().reshape(-1)
    return x.view(torch.float32)


def _i64(x: torch.Tensor) -> torch.Tensor:
    """float32 lanes (pairs) -> flat int64; copies only when the lanes are not 8-byte aligned."""
    if x.dim() != 1 or not x.is_contiguous():
        x = x.contiguous().reshape(-1)
    if x.storage_offset() % 2:
        x = x.clone()
    return x.view(torch.int64)


def _join(
    pieces: list[torch.Tensor] | tuple[torch.Tensor, ...],
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Concatenate, skipping empty pieces; one non-empty piece is returned as is (no copy)."""
    full = [p for p in pieces if p.numel()]
    if not full:
        return torch.zeros(0, dtype=pieces[0].dtype if len(pieces) else dtype, device=device)
    return full[0] if len(full) == 1 else torch.cat(full)
