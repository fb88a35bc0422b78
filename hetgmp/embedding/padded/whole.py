"""The padded exchange set up for the trainer's whole-step CUDA graph with several ranks
(:mod:`hetgmp.train.graphed_multi`): a step that reads nothing on the host, so that the
exchange, the dense part, the dense all-reduce and the optimizers replay as one graph.

Why: the padded step waited once per step for its sizes table (status, the operation every
rank runs, capacities grown from the step's counts). The host could not run ahead of the
device and a step was several graphs with eager work between them: on 2 H200s the user's
command trained at 0.41x of one GPU (batch 8192, 2026-11-26).

What replaces each use of the host's copy:

* **Capacities, fixed per epoch from the epoch's own batches.** Before an epoch trains, every
  rank counts, for each of its batches, the distinct rows it must query from each peer (a
  sorted unique over the epoch's ids, chunked), and one all-reduce (max) gives every rank every
  step's global maximum (:meth:`WholeStep.epoch_fits`). The query capacity ``q`` is the
  largest, rounded up (grown, never shrunk, at an epoch start): no batch of the epoch can
  overflow it. A step's pushes are rows the previous batch queried from that owner (its rows
  not stored here, and its mirrors that became due: a mirror becomes due only when a batch
  touches it, and is pushed at once), so ``p = q``. ``max_q`` caps ``q`` (memory, tests): a
  batch over the cap takes the eager step, whose host sizes send it to the exact transport
  (and the next one too while its pushes exceed ``p``), counted in :attr:`WholeStep.routed`.
* **Status**: ids are checked when the samples are loaded onto the device (the graph runs only
  on those); the step still clamps them.
* **The operation**: every rank replays the graph for the same step, by construction (a full
  batch on every rank: the global batch size, known to all, says so).
* **Counters**: the replay's owned / not-stored rows and pushes are summed on the device
  (``counters.replay_dev``), its bytes are the fixed buffers'.

A step's state then lives in fixed buffers only: the preparation's outputs (one set per ring
slot, :attr:`PrepRing.fixed`), the gradient summed per row in backward (:class:`Summed`), the
exchange's buffers and the table. The batch records made while capturing carry the capture's
host counts (``replayed``); :func:`materialize` gives them a replay's before an eager step
uses them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from hetgmp.comm.collectives import guarded
from hetgmp.embedding.batch import Batch, Summed
from hetgmp.embedding.collective.exact import SizedStep
from hetgmp.embedding.context import OP_FORWARD
from hetgmp.embedding.padded import ahead as read_ahead
from hetgmp.embedding.padded import epoch_scan, owner_update
from hetgmp.embedding.padded.buffers import Capacity
from hetgmp.embedding.padded.local_now import apply_stored

if TYPE_CHECKING:  # pragma: no cover
    from hetgmp.embedding.padded.exchange import PaddedExchange

QUANTUM = 256  # capacities are multiples of this (even: the fused kernels' int64 pairs)
# When a later epoch's batches outgrow the capacities, they grow to its needs plus 1/GROWTH_ROOM
# of them: every growth rebuilds the buffers and captures every graph again (~0.5 s on 2 H100s
# at batch 65536, where a reshuffled epoch needed 256 more distinct rows than the first's 135,680:
# bench/results/gpu/scaling_4gpu_s17/w2early_65536.log.txt), and an epoch's largest batch
# outgrows the running maximum ever more rarely, so a little room ends most later growths. The
# first epoch's capacities stay tight (a padding entry costs work in every segment).
GROWTH_ROOM = 32
# Pushes under the query capacity above bound 0 (the last batch's rows not stored here plus
# room for due mirrors; a due mirror that finds no room waits a step, counted): fewer bytes
# and less padding work than p = q. Matches the torch reference in Triton's interpreter
# (tests/test_padded_kernels.py). On by default since measured on 2 H100s (2026-11-26): 982 ->
# 586 B/sample, 10.50M -> 11.00M samples/s (12.13M with FUSED_OWNER_UPDATE), AUC equal, no wait.
TIGHT_PUSHES = True


def materialize(pb: Batch) -> Batch:
    """``pb`` with a replay's host counts (itself unless it was recorded while capturing): the
    last replay of its graph left its sizes tables in the exchange's pinned host copy (waited
    for here, where a step leaves the graph path)."""
    if not pb.replayed:
        return pb
    st, prep = pb.static, pb.prep
    assert st is not None and prep is not None
    if st.store.device.type == "cuda":
        torch.cuda.current_stream(st.store.device).synchronize()
    host = st.host_of(prep.ring).clone()
    mine, theirs = st.tables_of(prep.ring)
    s = SizedStep(prep, None, OP_FORWARD, False, mine, theirs, host, None, False)
    batch = s.make_batch()
    batch.prep, batch.static = prep, st
    return batch


def round_up(n: int, quantum: int = QUANTUM) -> int:
    return max(quantum, -(-n // quantum) * quantum)


class WholeStep:
    """The padded exchange (``padded``) of a table and its stepper (``stepper``: the pending
    gradient lives there) in whole-step mode (module docstring). ``max_q``: the largest query
    capacity per peer (None: as large as the epoch needs)."""

    def __init__(self, padded: PaddedExchange, stepper: Any, *, max_q: int | None = None) -> None:
        self.padded, self.stepper, self.ctx = padded, stepper, padded.ctx
        padded.whole = True
        for ring in padded.rings():
            ring.fixed = True
        self.max_q = None if max_q is None else max(2, max_q + max_q % 2)  # (even)
        self.routed = 0  # full batches over max_q (they ran eagerly, exactly)
        self.replays = 0
        self.epoch_max: list[int] = []  # the last epoch's global maximum per step
        # the last epoch's most rows in one step that one rank's batch holds more than
        # --bound times (a read one step ahead would miss more than the bound of their
        # sample-level updates: docs/scaling_plan.md), and whether the log said so
        self.epoch_hot = 0
        self._hot_said = False
        self._payloads_said = False  # (how the payloads travel: said once)
        self._deferred_seen = 0  # (the capacity-deferred push count at the last epoch start)
        self._scan = epoch_scan.EpochScan(self.ctx.store)  # (the epoch-start scan's kernels)
        self.scan_seconds = self.last_scan = 0.0  # (the epoch-start scans, the host's clock)
        self.scan_times: list[float] = []  # (each epoch start's, the first with the compile)
        self.scan_launch_times: list[float] = []  # (their launches alone, before the device's end)
        self._scan_said = False

    # ---------------------------------------------------------------- capacities
    def epoch_fits(
        self, sparse: torch.Tensor, positions: torch.Tensor, batch_size: int, steps: int,
        n: int | None = None,
    ) -> list[bool]:  # fmt: skip
        """(Collective, at an epoch start) whether each of the epoch's ``steps`` global steps
        fits the capacities, which grow to the epoch's largest counts (queries up to
        ``max_q``). ``sparse [N, F]``: this rank's samples on the device; ``positions``: the
        epoch's rows of it, batch after batch; ``n``: the ids a batch hands the table (None:
        ``batch_size x F``; a compact bag lookup's fewer)."""
        t0 = time.perf_counter()
        local = self.local_maxima(sparse, positions, batch_size)
        self.scan_launch_times.append(time.perf_counter() - t0)  # (the host's part)
        if local.is_cuda:  # (the scan's own time, not the wait for slower ranks below)
            torch.cuda.synchronize(local.device)
        self.last_scan = time.perf_counter() - t0
        self.scan_seconds += self.last_scan
        self.scan_times.append(self.last_scan)
        glob = torch.zeros(max(steps, 1), 4, dtype=torch.int64, device=self.ctx.store.device)
        k = min(steps, local.shape[0])
        glob[:k] = local[:k]
        env = self.ctx.env
        if env.group is not None and env.world_size > 1:
            with guarded(env, "epoch query maxima"):
                dist.all_reduce(glob, op=dist.ReduceOp.MAX, group=env.group)
        maxq, distinct, remote, hot = glob[:steps].t().tolist() if steps else ([],) * 4
        self.epoch_max, self.epoch_hot = maxq, max(hot, default=0)
        n = batch_size * int(sparse.shape[1]) if n is None else n
        self._grow(max(maxq, default=0), max(distinct, default=0), max(remote, default=0), n)
        cap = self.padded.frozen
        assert cap is not None
        fits = [m <= cap.q for m in maxq]
        self.routed += fits.count(False)
        return fits

    def _grow(self, need_q: int, need_u: int, need_r: int, n: int) -> None:
        """Fixed capacities for batches of ``n`` ids: ``need_q`` queries per peer, ``need_u``
        distinct rows, ``need_r`` rows not stored here per peer (never smaller than before for
        the same ``n``). Tight: a padding entry costs work in every segment and its bytes
        travel; but a capacity a later epoch outgrows takes room (:data:`GROWTH_ROOM`).
        Pushes: at bound 0 every mirror a batch touched is due at the next step, so ``p = q``; above, the last batch's rows not stored here (``need_r``: they must fit)
        plus room for due mirrors (a share of ``q``, doubled at an epoch start after a step
        had to keep some back)."""
        old = self.padded.frozen
        q, u = round_up(need_q), min(n, round_up(need_u))
        p = round_up(need_r + need_r // 2 + q // 8)
        if old is not None and old.n == n:
            if q > old.q:  # (a later epoch outgrew them: room for the next ones, GROWTH_ROOM)
                q = round_up(need_q + need_q // GROWTH_ROOM)
            if u > old.u:
                u = min(n, round_up(need_u + need_u // GROWTH_ROOM))
            q, u, p = max(q, old.q), max(u, old.u), max(p, old.p)
            if self._deferred_since_grow():
                p = 2 * p
        if self.max_q is not None:
            q = min(q, self.max_q)
        p = q if self.ctx.bound == 0 or not TIGHT_PUSHES else min(p, q)
        sw = self.ctx.opt.state_width
        cap = Capacity(q=q, p=p, u=u, n=n, o=u if sw else 0)
        if cap != old:
            self.padded.frozen = cap

    def _deferred_since_grow(self) -> bool:
        """Whether a step kept due pushes back for want of room since the last look (reads
        the device counter: at an epoch start, where the host waits anyway)."""
        now = int(self.ctx.counters.replay_dev[3])
        seen, self._deferred_seen = self._deferred_seen, now
        return now > seen

    def local_maxima(
        self, sparse: torch.Tensor, positions: torch.Tensor, batch_size: int
    ) -> torch.Tensor:
        """Per batch of ``positions``: ``[largest number of distinct rows this rank queries
        from one peer, distinct rows, largest number of rows not stored here of one peer,
        rows the batch holds more than --bound times]`` (``[batches, 4]``, :mod:`.epoch_scan`:
        by its kernels with the Triton backend, else by the torch reference)."""
        store, bound = self.ctx.store, self.ctx.bound
        if epoch_scan.KERNEL and self.ctx.kernels == "triton":
            return self._scan.maxima(bound, sparse, positions, batch_size)
        return epoch_scan.epoch_maxima_reference(store, bound, sparse, positions, batch_size)

    def epoch_notes(self, old: Capacity | None) -> list[str]:
        """What the log says after :meth:`epoch_fits` (``old``: the capacities before it):
        that they grew (buffers rebuilt, every graph captured again: seconds a user sees as
        a slow epoch start), and once, above bound 0, how many rows one step's batch holds
        more than ``--bound`` times."""
        new, out = self.padded.frozen, []
        st = self.padded.static
        if not self._scan_said and self.scan_seconds:
            self._scan_said = True
            out.append(f"epoch-start scan of the batches' rows per peer: {self.last_scan * 1e3:.0f} ms "
                       "(each epoch start; results: epoch_scan_s)")  # fmt: skip
        if st is not None and not self._payloads_said:
            self._payloads_said = True
            out.append(f"exchange payloads: {st.payload_note}")
        if old is not None and new != old:
            out.append(f"exchange capacities grew at an epoch start ({old} -> {new}): buffers "
                       "rebuilt, graphs captured again")  # fmt: skip
        if self.ctx.bound >= 1 and self.epoch_hot and not self._hot_said:
            self._hot_said = True
            out.append(f"up to {self.epoch_hot} rows per step occur more than --bound "
                       f"{self.ctx.bound} times in one rank's batch (sample-level updates: a read "
                       "one step ahead would miss more than the bound of theirs; "
                       "docs/scaling_plan.md)")  # fmt: skip
        return out

    # ---------------------------------------------------------------- graph bookkeeping
    def ready(self, shape: tuple[int, int]) -> int | None:
        """The ring slot the next step of ``shape`` would prepare into, if the pending state
        lets it run as a graph (the last step was a padded one on the current buffers, its
        gradient summed), else None."""
        pad, grads = self.padded, self.stepper.grads
        st, ring = pad.static, pad.ring(shape)
        if st is None or ring is None or grads is None or not isinstance(grads[1], Summed):
            return None
        pb = grads[0]
        if pb.static is not st or pb.prep is None or pb.prep.ring != ring.last:
            return None
        if pad.frozen is None or pad.frozen.n != shape[0] * shape[1] or not st.current:
            return None
        return ring.next_slot

    def comm(self) -> Any:
        """The env of the exchange's own communicator (for the captured collectives; collective
        at the first call, see :meth:`PaddedExchange.comm`)."""
        return self.padded.comm()

    @property
    def generation(self) -> object:
        """Changes whenever the exchange's buffers are rebuilt (captured graphs hold them)."""
        return self.padded.static

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Around the capture of a whole-step graph (or its plain run, on CPU); the step's
        side stream rejoins before the capture ends."""
        self.padded.set_plain(True)
        try:
            yield
            self.padded.join()
            self.padded.run_own_sum()  # (a split sum's own pass no pre-sync took: now)
            self.padded.ahead.join()
        finally:
            self.padded.set_plain(False)
            if self.padded.static is not None:  # (a failed capture's split-sum pass: dropped)
                owner_update.take_own_sum(self.padded.static)

    def apply_stored_now(self) -> None:
        """After a step that read the next batch ahead: its gradient on the rows stored here,
        now (:mod:`.local_now`; the primed rows are read again from the table when taken)."""
        grads, st = self.stepper.grads, self.padded.static
        if not read_ahead.STORED_AT_ONCE or grads is None or not isinstance(grads[1], Summed):
            return  # (an eager step's gradient per occurrence: the exchange applies it)
        pb = grads[0]
        if st is not None and pb.static is st and pb.prep is not None:
            apply_stored(st, pb.prep, grads[1].grad)

    def pending(self) -> tuple[Batch, Summed] | None:
        """The gradient a captured step leaves (restored after each replay of that graph;
        None after one that exchanged the next batch early: it pushed it)."""
        grads = self.stepper.grads
        assert grads is None or isinstance(grads[1], Summed), grads
        return grads

    def exchange_early(self) -> None:
        """After a batch's backward: the primed next batch's exchange (:mod:`.ahead`)."""
        st = self.stepper
        self.padded.ahead.exchange_early(
            lambda prep: st.step(prep, op=OP_FORWARD, error=None, training=True),
            lambda: int(st.count),
            self.padded.on_side,
        )

    def ready_early(self, shape: tuple[int, int]) -> int | None:
        """The ring slot of the next step of ``shape`` when an exchange made early left its
        rows (no gradient pending: only a graph that takes them may replay), else None."""
        pad, p = self.padded, self.padded.ahead.primed
        st, ring = pad.static, pad.ring(shape)
        if st is None or ring is None or p is None or not p.exact or p.batch is None:
            return None
        if self.stepper.grads is not None or p.batch.static is not st:
            return None
        if pad.frozen is None or pad.frozen.n != shape[0] * shape[1] or not st.current:
            return None
        return p.prep.ring if p.prep.ring == ring.next_slot else None

    def after_replay(
        self, shape: tuple[int, int], slot: int, grads: tuple[Batch, Summed] | None
    ) -> None:
        """Host bookkeeping of a replayed step: its ring slot and pending gradient, counters."""
        ring = self.padded.ring(shape)
        assert ring is not None
        ring.last = slot
        self.stepper.grads = grads
        st = self.padded.static
        assert st is not None
        c = self.ctx.counters
        c.count_bytes(sent=st.bytes_per_step, recv=st.bytes_per_step, reset=True)
        c.count_pushes(0)  # (the replay's pushes are summed on the device: replay_dev)
        c.set_rows_host(0, 0)
        c.rows_dev_step = st.rows_step
        c.accumulate_rows(device_part=False)
        self.padded.presyncs += 1
        self.replays += 1
