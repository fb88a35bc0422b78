"""``DistributedEmbedding``: the distributed table as an ``nn.Module`` (public API and autograd).

One ``forward`` is one training step (docs/architecture.md, "The staleness protocol"). The
module holds the rows (:mod:`.store`), the settings and ONE step engine
(:class:`~.engine.StepEngine`, chosen by :func:`~.engines.make_engine`: one rank's own step,
the collective stepper with its exact or padded exchange, or the async row service), and
forwards its public calls to that engine without asking which kind it is. The step's gradient
comes back through autograd and is applied at the next step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from hetgmp.comm.barrier_rider import BarrierRider
from hetgmp.comm.env import DistEnv
from hetgmp.embedding.collective.engine import CollectiveEngine
from hetgmp.embedding.context import StepContext
from hetgmp.embedding.counters import StepCounters
from hetgmp.embedding.engine import StepEngine
from hetgmp.embedding.engines import make_engine
from hetgmp.embedding.kernels import resolve as resolve_kernels
from hetgmp.embedding.local import LocalStep
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.options import (
    check_sizes,
    placement_of,
    resolve_exchange,
    resolve_replies,
    resolve_sync,
)
from hetgmp.embedding.padded.whole import WholeStep
from hetgmp.embedding.profile import PhaseTimer
from hetgmp.embedding.rowservice import AsyncConfig, AsyncStep
from hetgmp.embedding.store import RowStore
from hetgmp.embedding.tier_device import DeviceTier
from hetgmp.embedding.tier_host import SetupClock
from hetgmp.embedding.tier_owned import OwnedTier
from hetgmp.embedding.tier_setup import check_rows_on, tiered_store
from hetgmp.embedding.tiered import TieredRows
from hetgmp.partition.plan import Plan


class DistributedEmbedding(nn.Module):
    """An embedding table spread over the ranks of ``env``.

    ``plan`` (if given) decides owners and mirror priorities; otherwise ``placement`` (``hash``:
    ``id % world``; ``random``) decides owners and there are no mirrors. ``store_rate`` is the
    share of all rows each worker mirrors (top of its plan priority list). ``bound`` is the
    staleness bound in owner-applied sample-level updates (0 = bulk-synchronous). ``audit``
    makes owners return values for every query and records/checks every read's lag
    (``last_audit``); it costs bandwidth and is meant for tests. ``kernels`` picks the row-update
    backend (``auto`` = Triton on CUDA, torch otherwise); the resolved name is ``self.kernels``.
    ``replies``: ``"stale"`` (owners send values only for mirrors beyond the bound: fewest
    bytes, a second host round trip per step) or ``"all"`` (a value for every mirror query: more
    bytes, one host sync per step; for fast links such as NVLink); ``"auto"``: ``"all"`` on
    NCCL, else ``"stale"``. Both read the same values. ``exchange``: ``"exact"`` (payloads sized
    exactly) or ``"padded"`` (fixed capacities; on CUDA a step replays a few CUDA graphs when
    ``cuda_graphs``, its all-to-alls captured inside them on NCCL when ``graph_collectives``);
    padded needs ``replies="all"`` and no audit, and is used for training steps (eval and flush
    stay exact); its segments are fused Triton kernels (SGD and row-wise Adagrad), captured as graphs. ``"auto"``: padded where it applies on CUDA with several ranks (one rank
    takes its own step; ``exchange`` then says ``"exact"``). Diagnostics: ``padded_rebuilds``
    (every capacity taken) and ``padded_presyncs`` (steps whose pre-sync part ran in fixed
    shapes). ``sync``: ``"collective"`` (every step one exchange among all ranks) or
    ``"async"`` (each rank serves its owned rows from a ZeroMQ thread and ranks move at
    their own pace within ``async_config.max_lag`` steps; see
    :mod:`hetgmp.embedding.rowservice.step`); an async table holds sockets and a thread
    until :meth:`close` (also called by :func:`hetgmp.comm.launch.shutdown`).
    ``rows_on="host"``: rows in host memory, a device cache of ``cache_budget`` of them
    (:mod:`hetgmp.embedding.tiered`), first the hottest of ``row_counts``; ``setup_log``
    gets one line per start-up phase with its seconds (:class:`.tier_host.SetupClock`).
    """

    def __init__(
        self, num_rows: int, dim: int, env: DistEnv, plan: Plan | None = None, *,
        placement: str = "hash", store_rate: float = 0.0, bound: int = 0,
        optimizer: str = "sgd", lr: float = 0.01, init_scale: float = 0.01, seed: int = 0,
        adagrad_eps: float = 1e-10, adagrad_init: float = 0.0, audit: bool = False,
        kernels: str = "auto", replies: str = "stale", exchange: str = "auto",
        cuda_graphs: bool = True, graph_collectives: bool = True, sync: str = "collective",
        async_config: AsyncConfig | None = None, rows_on: str = "device",
        cache_budget: float = 1.0, row_counts: torch.Tensor | None = None,
        setup_log: Callable[[str], None] | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        check_sizes(num_rows, dim, bound, store_rate)
        self.num_rows, self.dim, self.bound = int(num_rows), int(dim), int(bound)
        self.env, self.device, self.audit = env, env.device, audit
        self.replies = resolve_replies(replies, env)
        self.kernels = resolve_kernels(kernels, env.device)
        self.opt = SparseOptimizer(optimizer, lr, adagrad_eps, adagrad_init, self.kernels)
        host = rows_on == "host"  # (several ranks: the exact exchange, see .tier_owned)
        exchange = "exact" if host and exchange == "auto" else exchange
        self.exchange = resolve_exchange(exchange, self.opt, self.replies, audit, env)
        self.sync = resolve_sync(sync, exchange, env)
        if self.sync == "async":
            self.exchange = "exact"  # (what the logs report: rows move point to point)
        owner, mirrors = placement_of(plan, self.num_rows, env, placement, store_rate, seed)
        check_rows_on(rows_on, cache_budget, world=env.world_size, device=env.device,
                      cuda_graphs=cuda_graphs, exchange=self.exchange, sync=self.sync)  # fmt: skip
        kw: dict[str, Any] = dict(
            rank=env.rank, world=env.world_size, owner=owner, mirrors=mirrors, opt=self.opt,
            seed=seed, init_scale=init_scale,
        )  # fmt: skip
        self.tier: TieredRows | DeviceTier | None = None  # (the host tier: rows in host memory)
        self.owned: OwnedTier | None = None  # (... its several ranks' side)
        if host:
            self.store, self.tier, self.owned = tiered_store(
                self.num_rows, self.dim, device=env.device, cache_budget=cache_budget,
                counts=row_counts, clock=SetupClock(setup_log), **kw,
            )  # fmt: skip
        else:
            self.store = RowStore(self.num_rows, self.dim, device=env.device, **kw)
        self._ctx = StepContext(
            env, self.store, self.opt, StepCounters(env.device),
            PhaseTimer(env.device, enabled=False), self.bound,
            send_all=audit or self.replies == "all", audit=audit, tier=self.tier,
            owned=self.owned,
        )  # fmt: skip
        # the leaf the autograd nodes hang on (see lookup._LocalLookup; a plain attribute, not
        # a parameter: it never gets a gradient)
        self._anchor = torch.zeros((), requires_grad=True)
        self.engine: StepEngine = make_engine(
            self._ctx, self._anchor, exchange=self.exchange, audit=audit, sync=self.sync,
            cuda_graphs=cuda_graphs, graph_collectives=graph_collectives,
            async_config=async_config,
        )  # fmt: skip
        if host and self.owned is None and self.engine.kind != "local":  # (audit)
            raise ValueError(
                "rows_on='host' on one rank runs in the one-rank step only (not audit)"
            )
        if self.engine.kind == "local" and exchange == "auto":
            self.exchange = "exact"  # (what the logs report; the one-rank step uses neither)

    # ------------------------------------------------------------------ public API
    def send_ahead(self, ids: torch.Tensor) -> None:
        """(Training, after ``backward``; ``sync="async"``, else :meth:`prefetch`) push this
        step's gradient and send the reads of the NEXT batch ``ids`` now: their round trip
        overlaps the rest of the step; a ``forward`` given this same tensor takes the answers
        (:meth:`.rowservice.step.AsyncStep.send_ahead`), one given others drops them."""
        self.engine.send_ahead(ids, training=self.training)

    def prefetch(self, ids: torch.Tensor) -> None:
        """Start the batch plan (unique ids, slot / owner lookup, block order) of the NEXT
        batch now; a following ``forward`` given this same tensor object uses it. On CUDA the
        work runs on a side stream (it needs no host sync); on CPU at once. Input problems
        are left for ``forward`` to report collectively."""
        self.engine.prefetch(ids, training=self.training)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up ``ids [B, F]`` (int64) -> ``[B, F, D]``; one call is one training step.

        Rules for callers (docs/python_api.md):

        * **Collective: every rank calls it every step**, in the same order as the others,
          also a rank that has run out of samples: it passes an empty ``[0, F]`` batch, so the
          peers still meet it at the step's exchanges (evaluation and :meth:`flush` likewise).
        * **It applies the previous step's update first.** The gradient that reaches the rows
          through ``backward`` is only captured; owners apply it during the *next* forward (or
          :meth:`flush`). Read values after a :meth:`flush` (``state_dict`` and evaluation
          flush for you).
        * Each row gets one update of its summed gradient, so to train like one process on the
          global batch, scale the loss by the **global** batch (sum of per-sample losses /
          samples over all ranks) and sum dense gradients over ranks (``hetgmp.Trainer`` does).
        """
        return self.engine.forward(ids, training=self.training)

    def flush(self) -> None:
        """(Collective) push every pending gradient and mirror delta so owners hold final values."""
        self.engine.flush()

    def close(self) -> None:
        """Release what the table holds beyond memory (``sync="async"``: its service thread,
        sockets and ZeroMQ context; idempotent; a no-op otherwise)."""
        self.engine.close()

    def peers_full(self, full: bool | None) -> None:
        """Say, before a training step, whether every rank's batch of it is full (a custom
        loop whose ranks may hold batches of different sizes, rule 1 of docs/python_api.md;
        the trainer says it each step). Said True, the ranks may take the padded transport's
        pre-sync path; never said (or None, which unsays it), they take the padded transport
        without it (no rank can take it alone then: a hang on CUDA)."""
        self.engine.peers_full(full)

    def apply_pending(self) -> None:
        """One rank: apply the last backward's row update now instead of at the next forward
        (identical arithmetic; a whole-step CUDA graph needs the update inside its step).
        With several ranks updates travel with the next step's exchange: use :meth:`flush`."""
        self.engine.apply_pending()

    def mark_staged(self, on: bool) -> None:
        """While on, a captured padded step records an event once its pre-sync gradient kernel
        is queued (the first of the exchange's chain after the rows' gradient sum), which
        :meth:`take_staged` hands over (``train/product_hold.py``)."""
        self._ctx.mark_staged, self._ctx.staged = on, None

    def take_staged(self) -> torch.cuda.Event | None:
        """The event :meth:`mark_staged` asked for, recorded since (None: none), cleared."""
        event, self._ctx.staged = self._ctx.staged, None
        return event

    def ride_barriers(self, rider: BarrierRider | None) -> None:
        """While set, the padded exchange's payload barriers certify ``rider``'s work too
        (``comm/barrier_rider.py``: the dense gradients' copy needs no meeting of its own)."""
        self._ctx.rider = rider

    @property
    def async_engine(self) -> AsyncStep | None:
        """The ``sync="async"`` step engine of several ranks (its clocks, global progress and
        service; :mod:`hetgmp.train.async_loop`), else None."""
        return self.engine.async_engine()

    @property
    def local_step(self) -> LocalStep | None:
        """The one-rank step engine (None with several ranks or audit)."""
        return self.engine.local_step()

    def counters(self) -> dict[str, int]:
        """Cumulative counters (bytes by kind, rows by source, pushes)."""
        return self.engine.counters()

    def step_counters(self) -> dict[str, int]:
        """The last step's counters."""
        return self._ctx.counters.step()

    def state_dict(  # type: ignore[override]
        self, *args: Any, destination: dict[str, Any] | None = None, prefix: str = "",
        keep_vars: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """``{"ids", "weight", "opt_state"}`` of the rows this rank owns, keyed by global id.

        **Collective**: it flushes first (pushes every pending gradient and mirror delta to the
        owners): every rank calls it at the same point, also through a parent's ``state_dict``.
        :meth:`load_state_dict` takes any union of the ranks' dicts (any rank count or plan).
        """
        self.flush()
        if self.tier is not None:  # (host memory then holds every row)
            self.tier.flush()
        sd = self.owned.owned_rows() if self.owned is not None else self.store.owned_rows()
        if destination is None:
            return sd
        destination.update({prefix + k: v for k, v in sd.items()})
        return destination

    def load_state_dict(
        self, sd: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """Load rows by global id from the union of any ranks' state dicts (any world size /
        plan). Every stored row takes its saved value; versions restart at 0 on all ranks, so
        mirrors start in sync. Pending gradients are dropped. ``strict=False``: rows ``sd``
        lacks keep their values (a warm start onto a grown vocabulary's new rows)."""
        if self.tier is not None:  # (host memory holds every row: rows sd lacks keep theirs)
            self.tier.flush()
        self.store.load_rows(sd, partial=not strict)
        if self.owned is not None:  # (several ranks: the owned rows' host copies too)
            self.owned.load_rows(sd, partial=not strict)
        self.engine.drop_pending()
        if self.tier is not None:  # (the rows went to host memory)
            self.tier.reload()
        return None

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # Called when a parent module loads a state dict containing this table.
        keys = ("ids", "weight", "opt_state")
        if all(prefix + k in state_dict for k in keys):
            self.load_state_dict({k: state_dict[prefix + k] for k in keys})

    def release_graphs(self) -> None:
        """Drop every CUDA graph this table captured (later steps capture again)."""
        self.engine.release_graphs()

    def extra_repr(self) -> str:
        return (
            f"num_rows={self.num_rows}, dim={self.dim}, rank={self.env.rank}/"
            f"{self.env.world_size}, owned={self.n_own}, mirrors={self.n_mir}, "
            f"bound={self.bound}, optimizer={self.opt.name}, kernels={self.kernels}, "
            f"replies={self.replies}"
        )

    # ------------------------------------------------------------------ views of the parts
    n_own = property(
        lambda self: self.store.n_own if self.tier is None else self.tier.num_rows,
        doc="Rows this rank owns (with a host tier: in host memory, some cached).",
    )
    n_mir = property(lambda self: self.store.n_mir, doc="Rows this rank mirrors.")
    weight = property(lambda self: self.store.weight, doc="``[n_own + n_mir, D]`` stored rows.")
    weight_full = property(lambda self: self.store.weight_full, doc="``weight`` + trash row.")
    version = property(lambda self: self.store.version, doc="Versions of the stored rows.")
    pending = property(lambda self: self.store.pending, doc="Mirrors' unpushed updates.")
    grad_acc = property(lambda self: self.store.grad_acc, doc="Mirrors' unpushed gradients.")
    delta_acc = property(lambda self: self.store.delta_acc, doc="Mirrors' applied deltas.")
    opt_state = property(lambda self: self.store.opt_state, doc="Sparse optimizer state.")
    stored_ids = property(lambda self: self.store.stored_ids, doc="Global ids by slot.")
    last_audit = property(lambda self: self._ctx.last_audit, doc="The last audit record.")

    @property
    def timer(self) -> PhaseTimer:
        """Per-phase wall-clock split of the step (bench/ turns it on)."""
        return self._ctx.timer

    @timer.setter
    def timer(self, value: PhaseTimer) -> None:
        self._ctx.timer = value

    @property
    def padded_rebuilds(self) -> list[Any]:
        """Every capacity the padded exchange took (empty without one)."""
        return self.engine.padded_rebuilds()

    @property
    def padded_presyncs(self) -> int:
        """Steps whose pre-sync part ran in fixed shapes (0 without a padded exchange)."""
        return self.engine.padded_presyncs()

    def whole_step(self, *, max_q: int | None = None) -> WholeStep | None:
        """The padded exchange set up for a whole-step CUDA graph of several ranks (made at
        the first call, before the first step; :mod:`.padded.whole`); None where this
        table has no padded exchange (one rank, exact, async)."""
        return self.engine.whole_step(max_q=max_q)

    def use_exact_exchange(self) -> None:
        """(Before the first step; collective like every step) the exact exchange in place of
        the padded one: what the trainer falls back to where ``--exchange auto`` chose padded
        for the host tier of several ranks and the whole-step flow then does not apply."""
        if self.exchange == "padded":
            self.engine = CollectiveEngine(self._ctx, None, self._anchor)
            self.exchange = "exact"

    # ------------------------------------------------------------------ for tests
    # (names the tests have used since before the engines had an interface)
    @property
    def _static(self) -> Any:  # (tests/gpu_padded_check.py looks at its graphs)
        return self.engine.padded_buffers()

    @property
    def _padded(self) -> Any:  # (tests/test_padded_kernels.py fixes its capacities)
        """The padded exchange (``PaddedExchange``), or None."""
        return self.engine.padded  # type: ignore[attr-defined]

    @property
    def _local(self) -> bool:
        return self.engine.kind == "local"

    @property
    def _one(self) -> LocalStep | None:
        return self.engine.local_step()

    @_one.setter
    def _one(self, value: LocalStep | None) -> None:  # (stands for a table without one)
        self.engine.one = value  # type: ignore[attr-defined]

    @property
    def _stepper(self) -> Any:
        """The stepper of several ranks (``Stepper`` or ``AsyncStep``)."""
        return self.engine.stepper  # type: ignore[attr-defined]


def engine_of(table: nn.Module) -> StepEngine | None:
    """The step engine of a :class:`DistributedEmbedding`; None for any other table (the
    trainer also takes other tables: any module with ``forward``, ``flush``, ``counters``,
    ``state_dict`` and ``load_state_dict``)."""
    return table.engine if isinstance(table, DistributedEmbedding) else None
