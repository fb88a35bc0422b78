"""Data-parallel dense gradients: one all-reduce over a flat buffer per step.

The trainer's loss is the SUM over local samples divided by the GLOBAL batch size, so the SUM of
the ranks' gradients is exactly the gradient of the global mean loss -- the same as one process on
the whole global batch. The dense learning rate therefore does not grow with the rank count (as it
does in HET-GMP, which sums mean-loss gradients).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from hetgmp.comm import peer_allreduce
from hetgmp.comm.barrier_rider import BarrierRider
from hetgmp.comm.collectives import all_reduce_sum, guarded
from hetgmp.comm.env import DistEnv
from hetgmp.comm.peer_allreduce import peer_all_reduce

# The first layer's weight placed last in the bucket, and the deferred product of its last
# rows computed first (models.deferred_wgrad.set_rows_hook): their all-reduce starts while the
# product of the other rows runs, the rest of the bucket is summed after it. On 2 H100s at batch
# 8192 the dense path after backward (the product ~35 us, the all-reduce ~40, Adam ~20) is as
# long as the exchange's chain beside it (docs/scaling_plan.md). Exact (tests/test_early_rows.py),
# but measured 6 % slower there (read_ahead_ab.sh variant "earlyrows",
# bench/results/gpu/own_split/: the split product and an all-reduce launched from inside
# backward slow the dense path more than they hide): off. NCCL or gloo groups; not with the
# peer-memory sums, nor with the dense part's own graph (its capture would hold the start, not
# the wait).
EARLY_ROWS = False


def early_rows_layer(
    env: DistEnv, first: tuple[nn.Linear, ...], params: list[nn.Parameter], sync_every: int
) -> nn.Linear | None:
    """(:data:`EARLY_ROWS`) the layer whose last rows' gradient is summed early (the first
    of ``first``, the model's ``first_linears()``), its weight moved to the end of ``params``
    (the bucket's order: the rows then end it); None where it does not apply."""
    if not (EARLY_ROWS and env.world_size > 1 and sync_every == 1 and first):
        return None
    last = [p for p in params if p is first[0].weight]
    if not last or not last[0].requires_grad:
        return None
    params[:] = [p for p in params if p is not last[0]] + last
    return first[0]


def sum_dense_grads(env: DistEnv, params: list[nn.Parameter]) -> None:
    """Replace every ``p.grad`` by its sum over ranks (collective; no-op for one process)."""
    if env.world_size <= 1 or not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce_sum(env, flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


@torch.no_grad()
def average_params(env: DistEnv, params: list[nn.Parameter]) -> None:
    """Replace every parameter by its mean over ranks (collective; ``--dense-sync-every k``
    under ``--sync async``: ranks step on their own gradients and meet every ``k`` steps)."""
    if env.world_size <= 1 or not params:
        return
    flat = torch.cat([p.reshape(-1) for p in params])
    all_reduce_sum(env, flat)
    flat /= env.world_size
    offset = 0
    for p in params:
        p.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


class GradBucket:
    """The dense parameters' gradients as views into one persistent flat buffer.

    Backward accumulates into the views in place (autograd adds into an existing ``.grad``), so
    the per-step sum over ranks is one in-place all-reduce of the buffer -- no ``torch.cat``, no
    copies back -- and zeroing is one fill. The optimizer must keep the views: zero with
    :meth:`zero_`, never ``zero_grad(set_to_none=True)``. On CUDA ranks of one host the buffer
    may live in peer memory and be summed there (:mod:`hetgmp.comm.peer_allreduce`, off by
    default; ``how`` says which way it is summed).
    """

    def __init__(
        self, env: DistEnv, params: list[nn.Parameter], *, summed: bool = True,
        adam: bool = False,
    ) -> None:  # fmt: skip
        self.env = env
        self.params = params
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            raise ValueError(f"dense parameters of several dtypes cannot share a bucket: {dtypes}")
        device = params[0].device if params else env.device
        dtype = params[0].dtype if params else torch.float32
        numel = sum(p.numel() for p in params)
        # (collective: every rank builds its bucket together; ``summed`` False: never
        # all-reduced, --dense-sync-every > 1 averages the parameters instead; ``adam``: the
        # optimizer is FlatAdam's kernel, which can sum the ranks' buckets itself)
        self.peer, self.how = peer_all_reduce(env, numel if summed else 0, dtype, adam=adam)
        # summed by the optimizer (peer_allreduce.ADAM_PEER): all_reduce() is a barrier, the
        # optimizer reads every rank's bucket (peer_grads), zero_() waits for every rank first
        self.peer_grads = (
            self.peer.bases if self.peer is not None and self.peer.in_optimizer else None
        )
        if self.peer is not None:
            self.flat = self.peer.flat
        else:
            self.flat = torch.zeros(numel, dtype=dtype, device=device)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = self.flat[offset : offset + n].view_as(p)
            offset += n
        # (SHARED_BARRIER: the copy into the peers' inboxes certified by the exchange's
        # barriers, once the training step hands it over: rider_on)
        self.rider: BarrierRider | None = None
        self._riding = False
        if self.peer is not None and self.peer.copied and peer_allreduce.SHARED_BARRIER:
            self.rider = BarrierRider(torch.cuda.current_stream(device), self.peer.copy_out)
        # (EARLY_ROWS: whether this step may start the tail's sum early, and the start and
        # pending work of the one started)
        self.armed = False
        self._early: tuple[int, dist.Work] | None = None

    def start_early(self, weight: torch.Tensor, r0: int, r1: int) -> None:
        """(:data:`EARLY_ROWS`, the deferred product's hook) ``weight``'s gradient rows
        ``[r0, r1)`` are final: when armed and they end the bucket, their sum over ranks
        starts now; :meth:`all_reduce` sums the rest and waits for it."""
        g = weight.grad
        if not self.armed or self.peer is not None or self._early is not None or g is None:
            return
        lo = int(g.storage_offset() - self.flat.storage_offset() + r0 * g.stride(0))
        if lo + (r1 - r0) * g.stride(0) != self.flat.numel() or self.env.world_size <= 1:
            return
        with guarded(self.env, "dense all-reduce (the first layer's last rows)"):
            work = dist.all_reduce(self.flat[lo:], group=self.env.group, async_op=True)
        assert work is not None
        self._early = (lo, work)

    def all_reduce(self) -> None:
        """Replace every gradient by its sum over ranks (collective; no-op for one process)."""
        if self.peer_grads is not None:  # (every rank's gradient complete; Adam sums them)
            riding, self._riding = self._riding, False  # (handed out this step: rider_on)
            certified = self.rider.take() if self.rider is not None and riding else None
            self.peer.ready(certified)  # type: ignore[union-attr]
        elif self.peer is not None:  # (its own group: the env a captured step swaps in is not)
            self.peer.all_reduce()
        elif self._early is not None:  # (the tail's sum started: the rest, then its wait)
            lo, work = self._early
            self._early = None
            if lo:
                all_reduce_sum(self.env, self.flat[:lo])
            with guarded(self.env, "dense all-reduce (the first layer's last rows)"):
                work.wait()
        elif self.env.world_size > 1 and self.flat.numel():
            all_reduce_sum(self.env, self.flat)

    def rider_on(self) -> BarrierRider | None:
        """(:data:`~hetgmp.comm.peer_allreduce.SHARED_BARRIER`) the rider for the exchange
        about to run after backward, bound to the current stream (the bucket's writer), and
        reset; None where the copy meets on its own: outside a whole-step capture too (an
        eager step's exchange may capture its own graph, which no eager stream may join)."""
        self._riding = False
        if self.rider is None or not torch.cuda.is_current_stream_capturing():
            return None
        self.rider.take()
        self.rider.stream = torch.cuda.current_stream(self.flat.device)
        self._riding = True
        return self.rider

    def drop_rider(self) -> None:
        """(The exchange failed) nothing it recorded certifies a later step's copy."""
        self._riding = False
        if self.rider is not None:
            self.rider.take()

    def zero_(self) -> None:
        """Zero every gradient (one fill of the buffer; summed by the optimizer, once every
        rank has read it)."""
        if self.peer_grads is not None and not self.peer.copied:  # type: ignore[union-attr]
            self.peer.barrier()  # type: ignore[union-attr]
        self.flat.zero_()

    def check_views(self) -> None:
        """Raise if some code replaced a ``.grad`` (then the all-reduce would miss it)."""
        for p in self.params:
            g = p.grad
            if (
                g is None
                or g.untyped_storage().data_ptr() != self.flat.untyped_storage().data_ptr()
            ):
                raise RuntimeError("a dense .grad is no longer a view of the gradient bucket")
