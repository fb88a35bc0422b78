"""The dense part of a training step -- everything after the embedding lookup: the model's
head, the loss and their backward -- replayed as one CUDA graph where the whole step cannot be.

Why: with several ranks (lockstep or ``--sync async``) each step's exchange sizes cross to the
host, so the whole-step graph of :mod:`hetgmp.train.graphed` does not apply, and the step
launched the dense part's kernels one by one from Python: the forward and the loss on the
training thread, the backward on autograd's device thread, around a hundred launches a step.
At the CLI's batch of 1024 each kernel runs for microseconds, so the step waited on the host
(2 H200s under ``--sync async``: 5.6 ms a step of forward, backward and optimizer on the host,
0.6 ms of kernels). The head's inputs have fixed shapes for a fixed batch size whatever ids the
batch holds, so it is captured once and replayed.

What a replay does: :meth:`~hetgmp.models.CTRModel.head` on fixed input buffers (the looked-up
rows, detached; the dense features; the labels), the loss, and its backward, which adds the
dense gradients into their :class:`~hetgmp.train.dense_sync.GradBucket` (fixed addresses) and
writes the rows' gradient into a fixed buffer. Outside the graph: the lookup (eager, its sizes
vary), the copies into the input buffers, and the rows' gradient handed to the lookup's
backward (``emb.backward(grad)``). The same arithmetic as the eager step, in the same order.

The step calls ``model.lookup`` and ``model.head``, not ``model(...)``: forward hooks on the
model itself do not run (hooks on ``model.embedding`` do, and inside a replay nothing Python
runs at all).

Where it applies (:func:`head_graph_support`): CUDA with ``--cuda-graphs`` (the default) when
the whole step is not a graph (several ranks; or one rank whose dense optimizer torch cannot
capture). Batches of another shape (the last partial batch) and the first
:data:`WARMUP_STEPS` full ones run eagerly with the same arithmetic.
"""

from __future__ import annotations

import torch
from torch import nn

from hetgmp.comm.env import DistEnv
from hetgmp.data.device_batches import DeviceBatch
from hetgmp.models import CTRModel

# eager steps before a capture (also the whole step's, hetgmp.train.graphed): the dense
# optimizer's state, Triton's and cuBLAS's set-up
WARMUP_STEPS = 2


def head_graph_support(env: DistEnv, model: CTRModel, *, enabled: bool) -> bool:
    """Whether a training step whose whole step is not a graph replays its dense part as
    one: CUDA, graphs on, and a model whose forward is ``head(lookup(ids))`` (a subclass
    that overrides ``forward`` instead of ``head`` trains eagerly)."""
    cls = type(model)
    split = cls.forward is CTRModel.forward and cls.head is not CTRModel.head
    return enabled and env.device.type == "cuda" and split


def forward_backward(
    model: CTRModel, loss_fn: nn.Module, amp: bool, emb: torch.Tensor,
    dense: torch.Tensor | None, labels: torch.Tensor, divisor: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(float32 logits [B, 1], loss sum)`` of the head over rows ``emb``, and the backward
    of ``loss sum / divisor`` (the global batch size: what
    :class:`~hetgmp.train.step.TrainStep` does after the lookup). A graph takes the divisor
    as a device scalar, so that one graph serves every global batch size (ranks run out of
    batches at different steps); dividing by it rounds as dividing by the number does."""
    # (no autocast cache: a captured step must cast the weights inside the graph)
    with torch.autocast(emb.device.type, dtype=torch.bfloat16, enabled=amp, cache_enabled=False):
        logits = model.head(emb, dense)
    logits = logits.float()
    loss_sum = loss_fn(logits, labels)
    (loss_sum / divisor).backward()
    return logits, loss_sum


class GraphedHead:
    """The head's forward and backward of a training step, replayed as a CUDA graph where
    the shapes allow (module docstring). Until the capture the shape follows the batches (a
    partial first batch does not fix it); the batch after :data:`WARMUP_STEPS` eager ones of
    one shape is captured, and from then on that shape replays. :attr:`replays` counts the
    steps that came from the graph."""

    def __init__(
        self, model: CTRModel, loss_fn: nn.Module, *, amp: bool, warmup: int = WARMUP_STEPS
    ) -> None:
        self.model, self.loss_fn, self.amp = model, loss_fn, amp
        self.params = model.dense_parameters()
        self.warmup0 = self.warmup = warmup
        self.key: tuple[object, ...] | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.addresses: tuple[int, ...] = ()  # of the parameters and gradients it captured
        # the graph's inputs (rows as a leaf that collects their gradient) and outputs
        self.emb = self.dense = self.labels = self.divisor = torch.zeros(0)
        self.logits = self.loss_sum = self.emb_grad = torch.zeros(0)
        self.replays = self.captures = 0

    def __call__(self, batch: DeviceBatch, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Look ``batch`` up, run the head and the backward of its loss (the table's rows
        get their gradient through the lookup); ``(float32 logits [B, 1], loss sum)``, valid
        until the next call (a replay rewrites them)."""
        with torch.autocast(
            batch.sparse.device.type, dtype=torch.bfloat16, enabled=self.amp, cache_enabled=False
        ):
            emb = self.model.lookup(batch.sparse)
        if not self._replays(emb, batch):
            return forward_backward(
                self.model, self.loss_fn, self.amp, emb, batch.dense, batch.labels,
                max(1, global_batch),
            )  # fmt: skip
        if self.graph is None or self.addresses != self._addresses():
            self._capture(emb, batch)  # (again if a parameter or gradient moved since)
        assert self.graph is not None
        self.divisor.fill_(float(max(1, global_batch)))
        self.emb.detach().copy_(emb.detach(), non_blocking=True)
        self.labels.copy_(batch.labels, non_blocking=True)
        if batch.dense is not None:
            self.dense.copy_(batch.dense, non_blocking=True)
        self.graph.replay()
        self.replays += 1
        if emb.requires_grad:  # (a copy: the next replay rewrites the graph's own buffer)
            emb.backward(self.emb_grad.clone())
        return self.logits, self.loss_sum

    def _replays(self, emb: torch.Tensor, batch: DeviceBatch) -> bool:
        """Whether this batch runs from the graph (else eagerly: warm-up, another shape)."""
        dense, labels = batch.dense, batch.labels
        key = (
            tuple(emb.shape), emb.dtype, tuple(labels.shape), labels.dtype,
            None if dense is None else (tuple(dense.shape), dense.dtype),
        )  # fmt: skip
        if self.graph is None and key != self.key and emb.shape[0]:
            self.key, self.warmup = key, self.warmup0  # (a new shape: warm it up)
        if key != self.key:
            return False
        if self.warmup > 0:
            self.warmup -= 1
            return False
        return True

    def _addresses(self) -> tuple[int, ...]:
        """Where the parameters and their gradients live (the graph reads and writes there:
        a parameter replaced rather than updated in place, e.g. flattened into one buffer by
        a later optimizer, would leave the graph training the old storage)."""
        out = [p.data_ptr() for p in self.params]
        out += [p.grad.data_ptr() if p.grad is not None else 0 for p in self.params]
        return tuple(out)

    def _capture(self, emb: torch.Tensor, batch: DeviceBatch) -> None:
        """Record the head's forward and backward on fixed input buffers (recording runs
        nothing; the caller then replays it for this batch)."""
        self.emb = emb.detach().clone().requires_grad_(True)
        self.dense = batch.dense.clone() if batch.dense is not None else torch.zeros(0)
        self.labels = batch.labels.clone()
        self.divisor = torch.ones((), device=emb.device)
        dense = self.dense if batch.dense is not None else None
        torch.cuda.synchronize(emb.device)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (the async service, NCCL's watchdog, a data prefetcher)
        # may use CUDA meanwhile, on streams of their own
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            logits, loss_sum = forward_backward(
                self.model, self.loss_fn, self.amp, self.emb, dense, self.labels, self.divisor
            )
        # (detached: kept, the captured autograd graph would keep its AccumulateGrad nodes,
        # bound to the capture stream, for the eager steps that follow)
        self.logits, self.loss_sum = logits.detach(), loss_sum.detach()
        assert self.emb.grad is not None  # (written by every replay from now on)
        self.emb_grad = self.emb.grad
        self.graph, self.addresses = graph, self._addresses()
        self.captures += 1
