"""One global step on this rank's batch, with no host synchronization.

The loss is ``sum of losses / global batch size``; back-propagation fills the dense gradients
(views into :class:`GradBucket`) and the embedding's row gradients; the bucket is summed over
ranks in place; the dense optimizer steps. The step returns this rank's ``[loss sum, correct]``
as a device tensor: reading it would wait for the device, so the caller adds it up and reads
the sums only at TRAIN lines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from hetgmp.comm.env import DistEnv
from hetgmp.data.device_batches import DeviceBatch, PendingBatch
from hetgmp.models import CTRModel
from hetgmp.models.deferred_wgrad import set_rows_hook
from hetgmp.train.adam_kernel import fused_adam_available
from hetgmp.train.dense_sync import GradBucket, average_params, early_rows_layer
from hetgmp.train.flat_adam import FlatAdam, flatten_parameters
from hetgmp.train.graphed_head import GraphedHead
from hetgmp.train.optim import make_dense_optimizer
from hetgmp.train.product_hold import ProductHold, hold_products
from hetgmp.train.profile import NoMarks, PhaseProfiler

if TYPE_CHECKING:
    from hetgmp.embedding import DistributedEmbedding
    from hetgmp.train.dense_server import DenseServer


def table(model: CTRModel) -> DistributedEmbedding:
    """``model.embedding`` as the trainer drives it. The models take any row module (typed
    ``nn.Module``: they only look rows up); training also calls the table's own methods
    (``flush``, ``apply_pending``, ...), those of :class:`DistributedEmbedding` (the tests'
    one-process ``ReferenceEmbedding`` has the ones its paths reach)."""
    return cast("DistributedEmbedding", model.embedding)


# A captured step's loss and accuracy sums made beside its backward, not after its optimizer:
# at the end of the step they sat on the path the next step waits for (hetgmp.train.
# inputs_ahead.FILL_BESIDE says which; ~15 us of five small kernels on 2 H100s at batch 8192).
METRICS_BESIDE = True


def _metrics(logits: torch.Tensor, loss_sum: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """float32 ``[loss sum, correct predictions]`` of a step."""
    with torch.no_grad():
        correct = ((logits > 0).float() == labels).sum()
        return torch.stack([loss_sum.detach(), correct])


class TrainStep:
    """The model, its dense gradient bucket and optimizer, and the step that uses them."""

    def __init__(
        self, env: DistEnv, model: CTRModel, *, optimizer: str, lr: float, amp: bool,
        sync_every: int = 1,
    ) -> None:  # fmt: skip
        self.env = env
        self.model = model
        self.amp = amp
        self.dense_params = params = model.dense_parameters()
        early = early_rows_layer(env, model.first_linears(), params, sync_every)
        # Adam on CUDA: over flat buffers (hetgmp.train.flat_adam says why)
        flat = env.device.type == "cuda" and optimizer == "adam" and bool(params)
        flat = flat and all(p.dtype == torch.float32 for p in params)
        flat_params = flatten_parameters(params) if flat else None
        fused_adam = fused_adam_available(env.device, "auto")  # (FlatAdam's kernel: on CUDA)
        self.bucket = GradBucket(
            env, params, summed=sync_every == 1, adam=flat_params is not None and fused_adam
        )
        if early is not None:
            set_rows_hook(early, self.bucket.start_early)
        self.optimizer: torch.optim.Optimizer
        if flat_params is not None:
            self.optimizer = FlatAdam(
                params, flat_params, self.bucket.flat, lr=lr, peer_grads=self.bucket.peer_grads
            )
        else:
            self.optimizer = make_dense_optimizer(optimizer, params, lr, env.device)
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
        # apply the embedding's row update right after backward, not at the next forward
        # (one rank; what a whole-step CUDA graph needs: hetgmp.train.graphed)
        self.rows_now = False
        self._checked = False  # the bucket's views are verified after the first step
        # dense sync: 1 = gradients summed every step; k > 1 = each rank steps on its own
        # gradient and the parameters are averaged every k steps (--dense-sync-every)
        self.sync_every, self.since_sync = sync_every, 0
        # --sync async with unequal step counts: no collective at all, the dense parameters go
        # through the ranks' services instead (hetgmp.train.dense_server; set by async_loop)
        self.dense_server: DenseServer | None = None
        # the dense part as a CUDA graph (set by the trainer where it applies: graphed_head)
        self.head: GraphedHead | None = None
        self._side: torch.cuda.Stream | None = None  # (METRICS_BESIDE's stream)

    def __call__(
        self,
        batch: DeviceBatch | PendingBatch,
        global_batch: int,
        marks: NoMarks | PhaseProfiler | None = None,
        after_backward: Callable[[], None] | None = None,
    ) -> torch.Tensor:
        """Train on ``batch`` (this rank's share of a global batch of ``global_batch``
        samples); returns float32 ``[loss sum, correct predictions]`` on the device.
        ``after_backward``: called once the gradients exist, before the optimizers (the
        async loop sends the next batch's reads there)."""
        marks = marks if marks is not None else NoMarks()
        if isinstance(batch, PendingBatch):  # (a resident source's deferred batch: gathered)
            batch = batch.gather()
        self.model.train()
        hold: ProductHold | None = None
        if self.head is not None:
            logits, loss_sum = self.head(batch, global_batch)
            metrics = self._metrics_beside(logits, loss_sum, batch.labels)
        else:
            # (no autocast cache: a captured step must cast the weights inside the graph)
            with torch.autocast(
                self.env.device.type, dtype=torch.bfloat16, enabled=self.amp, cache_enabled=False
            ):
                logits = self.model(batch.sparse, batch.dense)
            logits = logits.float()
            loss_sum = self.loss_fn(logits, batch.labels)
            metrics = self._metrics_beside(logits, loss_sum, batch.labels)
            hold = self._backward(loss_sum / max(1, global_batch), after_backward)
        if self.rows_now:
            table(self.model).apply_pending()
        if after_backward is not None:
            self._after_backward(after_backward, hold)
        marks.mark("fwd_bwd")
        if self.sync_every == 1 and self.dense_server is None:
            self.bucket.all_reduce()
        else:  # this rank's gradient at a global batch's scale (its local mean loss)
            self.bucket.flat.mul_(self.env.world_size)
        marks.mark("sync")
        self.optimizer.step()
        self.bucket.zero_()
        if self.dense_server is not None:
            self.dense_server.after_step()
        elif self.sync_every > 1:
            self.since_sync += 1
            if self.since_sync == self.sync_every:
                self.average_dense()
        marks.mark("opt")
        if not self._checked:  # a replaced .grad would silently miss the all-reduce
            self.bucket.check_views()
            self._checked = True
        if metrics is not None:
            torch.cuda.current_stream().wait_stream(self._side)  # type: ignore[arg-type]
            return metrics
        return _metrics(logits, loss_sum, batch.labels)

    def _backward(
        self, loss: torch.Tensor, after_backward: Callable[[], None] | None
    ) -> ProductHold | None:
        """``loss.backward()``; returns the first layer's products held for after
        ``after_backward`` (``train/product_hold.py``), if any."""
        # (the first layer's last rows summed from inside backward: dense_sync.EARLY_ROWS)
        self.bucket.armed = self.sync_every == 1 and self.dense_server is None
        hold = hold_products(self.model, table(self.model), after_backward)
        try:
            loss.backward()
        except BaseException:
            self.bucket.armed = False
            if hold is not None:
                hold.close()
            raise
        finally:  # (this backward's products are held by now: no later backward's may be)
            if hold is not None:
                hold.close_gate()
        if hold is None:
            self.bucket.armed = False
        return hold

    def _after_backward(self, after_backward: Callable[[], None], hold: ProductHold | None) -> None:
        """``after_backward()``, then the first layer's products ``hold`` kept (they follow
        the exchange's first kernel: ``train/product_hold.py``)."""
        # (the dense gradients' copy certified by the exchange's barriers, when it can ride:
        # peer_allreduce.SHARED_BARRIER; not under held products, which follow the exchange)
        rider = self.bucket.rider_on() if hold is None else None
        if rider is not None:
            table(self.model).ride_barriers(rider)
        try:
            after_backward()
        except BaseException:
            self.bucket.drop_rider()
            if hold is not None:
                hold.close()
                self.bucket.armed = False
            raise
        finally:
            if rider is not None:
                table(self.model).ride_barriers(None)
        if hold is not None:
            try:
                hold.release()
            finally:
                self.bucket.armed = False

    def _metrics_beside(
        self, logits: torch.Tensor, loss_sum: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor | None:
        """In a step being captured on CUDA (:data:`METRICS_BESIDE`): the step's ``[loss sum,
        correct]`` on a side stream once the loss is made (joined at the step's end),
        else None (made at the end, in order)."""
        if not (METRICS_BESIDE and logits.is_cuda and torch.cuda.is_current_stream_capturing()):
            return None
        if self._side is None:
            self._side = torch.cuda.Stream(logits.device)
        self._side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._side):
            return _metrics(logits, loss_sum, labels)

    def average_dense(self) -> None:
        """(``sync_every > 1``, collective) the dense parameters averaged over ranks now, so
        every rank holds the same model (every k steps, and before evaluation, checkpoints and
        the end of training). A no-op with a dense server (its ``finish`` does that)."""
        if self.dense_server is None and self.sync_every > 1 and self.since_sync:
            average_params(self.env, self.dense_params)
        self.since_sync = 0
