"""The whole training step of one CUDA rank, replayed as one CUDA graph.

Why: a step is some 40-60 kernels (lookup, the MLP's forward and backward, loss, row update,
fused Adam). At batch 8192 most of them run for a few microseconds, so launching them one by one
from Python leaves the GPU waiting on the host; one graph replay costs the host ~10 us.

What the graph holds: the one-rank lookup (:class:`~hetgmp.embedding.local.LocalStep`,
no host sync), the model's forward and backward, the row update -- applied at the end of the step
that produced it (:meth:`~hetgmp.embedding.DistributedEmbedding.apply_pending`) instead of at the
next forward, which is the same arithmetic since nothing reads the rows in between, and which
keeps the graph self-contained -- the dense optimizer and the step's ``[loss sum, correct]``.
Each replay first copies the batch into the graph's fixed input buffers; a batch of the
device-resident samples (:class:`~hetgmp.data.device_batches.PendingBatch`) is gathered inside
the graph instead, from its positions: one copy per step, not seven kernels outside the graph.
What stays outside per step: that copy, the replay, the range flag's copy to the host and the
caller's running sums.

Where it applies (:func:`graph_support`): CUDA, one rank (with several ranks each step's
exchange sizes cross to the host), a dense optimizer that torch can capture (fused Adam or
SGD), no multi-hot bags (their lookup's size is the batch's; the dense part's graph then)
unless they take the compact fixed lookup (``multi_hot.ONE_RANK_COMPACT``: its capacity set
at the resident samples' epoch starts, :meth:`GraphedStep.epoch_check`, a batch past it
eager), and
with ``--rows-on host`` only the tier decided on the device (its lookup gathers the missed rows
inside the graph; the cached rows are re-picked between replays, :meth:`LocalStep.before_replay`).
:func:`multi_graph_support` says the same for a rank of several (:mod:`.graphed_multi`).
Steps of another shape (the last partial batch), the warm-up steps before the capture and
profiled steps (``--profile-steps`` splits the step with synchronizing marks) run eagerly with
the same arithmetic. Out-of-range ids are clamped in the graph as in the eager step and reported
from a device flag a few steps later, naming the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hetgmp.comm.env import DistEnv
from hetgmp.data.device_batches import DeviceBatch, PendingBatch, ResidentSource
from hetgmp.embedding import engine_of
from hetgmp.train.graphed_head import WARMUP_STEPS
from hetgmp.train.multi_hot import bag_verdicts
from hetgmp.train.profile import NoMarks, PhaseProfiler, ReplayTimer
from hetgmp.train.step import TrainStep, table

GRAPH_DENSE_OPTIMIZERS = ("adam", "sgd")  # torch's fused CUDA kernels, capturable


def graph_support(
    env: DistEnv, step: TrainStep, *, enabled: bool, dense_optimizer: str
) -> str | None:
    """None when the whole step can be a CUDA graph, else why not (for the log)."""
    if not enabled:
        return "--no-cuda-graphs"
    if env.device.type != "cuda":
        return f"device {env.device.type}"
    engine = engine_of(step.model.embedding)
    local = None if engine is None else engine.local_step()
    if local is None:
        return "several ranks: every step's exchange sizes cross to the host"
    tier = local.tier
    if tier is not None and not tier.graph_ready:
        return "--rows-on host: the tier's lookup needs the Triton kernels (or --no-cuda-graphs)"
    if dense_optimizer not in GRAPH_DENSE_OPTIMIZERS:
        return f"--dense-optimizer {dense_optimizer}: torch cannot capture it"
    if not _fixed_bags_only(step):
        # The pooled lookup (hetgmp.models.pooling.BagLayout.lookup) takes the padding slots
        # out of the bags with a boolean mask: the table then looks up a batch-dependent
        # number of ids, whose size only the host learns (a sync), and a CUDA graph replays
        # fixed shapes. Its fixed-shape form (BagLayout.fixed: every slot handed to the table,
        # padding standing in for the sample's own rows; hetgmp.train.multi_hot.FIXED_SHAPE,
        # off until run on a GPU, issue 34) has no such read. The dense part's graph
        # (graphed_head) takes the pooled [B, F + K, D] input: fixed shapes either way.
        return "multi-hot bags: the pooled lookup's size depends on the batch (read on the host)"
    return None


def multi_graph_support(step: TrainStep, cfg: Any) -> str | None:
    """None when a rank of several can replay its whole step as one CUDA graph
    (:mod:`.graphed_multi`), else why not (for the log; the data source is checked when it
    opens)."""
    env, emb = step.env, step.model.embedding
    if not cfg.cuda_graphs:
        return "--no-cuda-graphs"
    if env.device.type != "cuda":
        return f"device {env.device.type}"
    if cfg.dense_optimizer not in GRAPH_DENSE_OPTIMIZERS:
        return f"--dense-optimizer {cfg.dense_optimizer}: torch cannot capture it"
    if cfg.dense_sync_every != 1:
        return "--dense-sync-every != 1"
    engine = engine_of(emb)
    if engine is None or engine.kind != "collective" or emb.exchange != "padded":
        return "several ranks need the padded exchange (--exchange, --replies, --sync)"
    if not _fixed_bags_only(step):  # (the compact lookup's size is the batch's)
        return "multi-hot bags need the fixed-shape lookup (hetgmp.train.multi_hot.FIXED_SHAPE)"
    return None


def _fixed_bags_only(step: TrainStep) -> bool:
    """Whether the model has no multi-hot bags, or takes them in fixed shapes."""
    bags = getattr(step.model, "bags", None)
    return bags is None or bool(bags.fixed)


class GraphedStep:
    """``TrainStep``'s call, replayed as a CUDA graph where the shapes allow (module docstring).

    The first full batch fixes the captured shape (batch size, dense features, global batch);
    :attr:`replays` counts the steps that came from the graph. ``time_replays``: the device
    time of that many replays (after the capture) is measured with events, for
    ``timer``, a :class:`~.profile.ReplayTimer` (``--profile-steps``: profiled steps themselves run eagerly)."""

    def __init__(
        self, step: TrainStep, *, warmup: int = WARMUP_STEPS, time_replays: int = 0
    ) -> None:
        one = table(step.model).local_step
        if one is None:
            raise ValueError("a whole-step CUDA graph needs the one-rank embedding step")
        self.step, self.one = step, one
        step.rows_now = True  # every step, eager ones too: no update waits across a replay
        self.warmup = warmup
        self.key: tuple[int, bool, int, bool] | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: DeviceBatch | None = None
        self.source: ResidentSource | None = None  # (pending batches: where the graph gathers)
        self.pos: torch.Tensor | None = None  # (and its positions input)
        self.out: torch.Tensor | None = None
        self.layout: tuple[int, int] | None = None  # (LocalStep.layout() at the capture)
        self.replays = 0
        self.timer = ReplayTimer(time_replays)

    def __call__(
        self,
        batch: DeviceBatch | PendingBatch,
        global_batch: int,
        marks: NoMarks | PhaseProfiler | None = None,
    ) -> torch.Tensor:
        """Train on ``batch``; returns float32 ``[loss sum, correct]`` on the device, valid
        until the next call (a replay rewrites it; stream order keeps work enqueued before
        then correct)."""
        pending = isinstance(batch, PendingBatch)
        dense = batch.has_dense if isinstance(batch, PendingBatch) else batch.dense is not None
        key = (len(batch), dense, global_batch, pending)
        if self.key is None and len(batch):
            self.key = key
        profiled = isinstance(marks, PhaseProfiler) and marks.active
        foreign = (
            isinstance(batch, PendingBatch)
            and self.source is not None
            and batch.source is not self.source
        )
        # (a batch past the compact bag lookup's capacity: the eager step's variable layout)
        over = isinstance(batch, PendingBatch) and not batch.fits
        if key != self.key or profiled or self.warmup > 0 or foreign or over:
            if key == self.key:
                self.warmup -= 1
            return self.step(batch, global_batch, marks)  # (it gathers a pending batch)
        if self.graph is not None and self.one.layout() != self.layout:
            self.graph = None  # (the rows it holds moved: a device tier grew; captured again)
        if self.graph is None:
            self._capture(batch, global_batch)
        assert self.graph is not None and self.out is not None
        self._load(batch)
        self.one.before_replay()
        # (not the replay right after capture)
        self.timer.replay(self.graph.replay, timed=self.replays > 0)
        self.one.replayed(batch.sparse if isinstance(batch, DeviceBatch) else _ids(batch))
        self.replays += 1
        return self.out

    def compact_bags(self) -> bool:
        """Whether the model's bags take the compact fixed lookup, whose capacity the
        resident samples' epoch starts set (:meth:`epoch_check`)."""
        bags = getattr(self.step.model, "bags", None)
        return bags is not None and bool(bags.fixed and bags.compact)

    def epoch_check(
        self, sparse: torch.Tensor, positions: torch.Tensor, batch_size: int,
        note: Callable[[str], None] = lambda _line: None,
    ) -> list[bool]:  # fmt: skip
        """(At an epoch start of the resident samples) each full batch's verdict: its bag
        values within the compact lookup's capacity (set by the first epoch's batches,
        :func:`~hetgmp.train.multi_hot.bag_verdicts`); a batch past it trains eagerly. ``note``:
        the log's, told the capacity once and the batches past it."""
        bags = self.step.model.bags
        assert bags is not None
        steps = positions.numel() // max(batch_size, 1)
        return bag_verdicts(bags, self.step.env, steps, sparse, positions, batch_size, note)

    def _load(self, batch: DeviceBatch | PendingBatch) -> None:
        if isinstance(batch, PendingBatch):
            assert self.pos is not None
            self.pos.copy_(batch.pos, non_blocking=True)
            return
        inp = self.inputs
        assert inp is not None
        inp.sparse.copy_(batch.sparse, non_blocking=True)
        inp.labels.copy_(batch.labels, non_blocking=True)
        if inp.dense is not None and batch.dense is not None:
            inp.dense.copy_(batch.dense, non_blocking=True)

    def _capture(self, batch: DeviceBatch | PendingBatch, global_batch: int) -> None:
        """Record one step on fixed input buffers (recording runs nothing; the caller then
        replays it for this batch)."""
        self.one.drain_bad_checks(wait=True)
        if isinstance(batch, PendingBatch):  # (the resident arrays never move while it trains)
            self.source, self.pos = batch.source, batch.pos.clone()
        else:
            dense = None if batch.dense is None else batch.dense.clone()
            self.inputs = DeviceBatch(batch.sparse.clone(), dense, batch.labels.clone())
        torch.cuda.synchronize(self.step.env.device)
        graph = torch.cuda.CUDAGraph()
        self.one.capturing = True
        try:
            # thread_local: another thread (a data prefetcher) may use CUDA meanwhile
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                inputs = self.inputs
                if self.source is not None and self.pos is not None:
                    inputs = self.source.gather(self.pos)
                assert inputs is not None
                self.out = self.step(inputs, global_batch)
        finally:
            self.one.capturing = False
        self.graph, self.layout = graph, self.one.layout()


def _ids(batch: PendingBatch) -> Callable[[], torch.Tensor]:
    """How to get a pending batch's ids for an error message (gathered only then)."""
    sparse, pos = batch.source.sparse, batch.pos  # (held: the source may close before the check)
    return lambda: sparse.index_select(0, pos).long()
