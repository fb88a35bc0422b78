"""The embedding modules compared by the GPU benchmark (issue 7), behind one small interface.

Every contender is an ``nn.Module`` with ``forward(ids [B, F] int64) -> [B, F, D]`` (autograd),
``after_backward()`` (its sparse update, called after ``loss.backward()``; a no-op for hetgmp,
which applies a step's gradients at the start of the next forward), ``bytes_sent()`` (cumulative
bytes this rank sent to OTHER ranks, by kind), ``rows()`` (the rows this rank owns, after any
pending update, for correctness checks) and a ``timer`` (:class:`bench.gpu.timing.Phases`).

All start from the same initial rows (:func:`hetgmp.embedding.initial_rows`, a function of
seed and global row id) and apply plain SGD to the per-step summed gradient, so after k steps on
the same global batches they hold the same rows as :class:`hetgmp.embedding.ReferenceEmbedding`.

* ``torch``     (a) one fused ``nn.Embedding(num_rows, D, sparse=True)`` on one GPU and
                ``torch.optim.SGD`` on its sparse gradient: what a PyTorch user writes.
* ``rowwise``   (b) rows sharded by ``id % world`` (TorchRec / HugeCTR row-wise layout),
                bulk-synchronous: unique ids per step, one ``all_to_all_single`` for the ids,
                one for the values, one for the gradients; owners sum and apply at once.
* ``tablewise`` (c) whole fields per rank, balanced by rows (NVIDIA DLRM layout); same exchange
                (deduplicated, so it is not handicapped against (b)).
* ``hetgmp-*``  (d) :class:`hetgmp.embedding.DistributedEmbedding` with a partitioned plan
                (store_rate, bound) or hash placement.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hetgmp.comm.env import DistEnv
from hetgmp.comm.exchange import exchange_counts, exchange_payload
from hetgmp.embedding import DistributedEmbedding, initial_rows

from .timing import Phases

INIT_SCALE = 0.01
BYTE_KINDS = ("ids", "versions", "values", "gradients")


def _zero_bytes() -> dict[str, int]:
    return dict.fromkeys(BYTE_KINDS, 0)


class Contender(nn.Module):
    """Common plumbing (see the module docstring)."""

    name = "contender"

    def __init__(self, num_rows: int, dim: int, env: DistEnv) -> None:
        super().__init__()
        self.num_rows, self.dim, self.env = int(num_rows), int(dim), env
        self.device = env.device
        self.timer = Phases(env.device, enabled=False)
        self._bytes = _zero_bytes()

    def after_backward(self) -> None:
        """Apply this step's sparse update (bulk-synchronous contenders)."""

    def bytes_sent(self) -> dict[str, int]:
        """Cumulative bytes this rank sent to other ranks, by kind."""
        return dict(self._bytes)

    def counters(self) -> dict[str, int]:
        """Extra runtime counters (rows by source...), empty by default."""
        return {}

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover - abstract
        """(global ids, values) of the rows this rank owns, on the CPU, updates applied."""
        raise NotImplementedError

    def set_timer(self, timer: Phases) -> None:
        self.timer = timer

    prefetches = False  # True: the harness hands the next batch to prefetch() during a step

    def prefetch(self, ids: torch.Tensor) -> None:
        """Start preprocessing the next batch's ids (contenders that can overlap it)."""


class TorchFused(Contender):
    """(a) plain PyTorch: one ``nn.Embedding(sparse=True)`` for all fields + ``optim.SGD``."""

    name = "torch"

    def __init__(self, num_rows: int, dim: int, env: DistEnv, *, lr: float, seed: int) -> None:
        super().__init__(num_rows, dim, env)
        if env.world_size != 1:
            raise ValueError("the plain PyTorch contender runs on one GPU (world size 1)")
        ids = torch.arange(self.num_rows, dtype=torch.int64, device=self.device)
        w = initial_rows(ids, self.dim, seed=seed, scale=INIT_SCALE)
        del ids
        self.emb = nn.Embedding(self.num_rows, self.dim, sparse=True, _weight=w)
        self.opt = torch.optim.SGD(self.emb.parameters(), lr=lr)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.timer.start()
        out = self.emb(ids)
        self.timer.mark("lookup")
        return out

    def after_backward(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.timer.mark("update")

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.arange(self.num_rows, dtype=torch.int64),
            self.emb.weight.detach().cpu().clone(),
        )


class AllToAllSharded(Contender):
    """(b)/(c) model-parallel rows with a deduplicated all-to-all every step, bulk-synchronous.

    ``owner(ids)`` and ``local(ids)`` map global ids to (rank, row in that rank's shard); the
    subclasses give them in closed form, so there is no per-row placement table.
    """

    def __init__(
        self, num_rows: int, dim: int, env: DistEnv, owned_ids: torch.Tensor, *, lr: float,
        seed: int,
    ) -> None:  # fmt: skip
        super().__init__(num_rows, dim, env)
        self.lr = float(lr)
        self.owned_ids = owned_ids.to(self.device)
        self.weight = initial_rows(self.owned_ids, self.dim, seed=seed, scale=INIT_SCALE)
        self._pending: dict[str, Any] | None = None
        self._grad: torch.Tensor | None = None

    def owner(self, ids: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def local(self, ids: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _exchange(
        self, x: torch.Tensor, send: list[int], recv: list[int], what: str
    ) -> torch.Tensor:
        return exchange_payload(self.env, x.reshape(-1), send, recv, what)

    def _off_rank(self, counts: list[int]) -> int:
        return sum(c for j, c in enumerate(counts) if j != self.env.rank)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        env, w, d = self.env, self.env.world_size, self.dim
        t = self.timer
        t.start()
        b, f = ids.shape
        uniq, inv = torch.unique(ids.reshape(-1), return_inverse=True)
        dest = self.owner(uniq)
        order = torch.argsort(dest, stable=True)
        send_ids = uniq[order]
        counts = torch.bincount(dest, minlength=w)
        t.mark("preprocess")
        # One host round trip: the counts' all-to-all waits for them; .tolist() then is free.
        recv_n = exchange_counts(env, counts[:, None], "sharded size exchange")[:, 0].tolist()
        send_n = counts.tolist()
        recv_ids = self._exchange(send_ids, send_n, recv_n, "sharded id exchange")
        t.mark("exchange")
        local = self.local(recv_ids)
        vals = self.weight.index_select(0, local)
        t.mark("lookup")
        got = self._exchange(
            vals, [n * d for n in recv_n], [n * d for n in send_n], "sharded value exchange"
        ).view(-1, d)
        t.mark("exchange")
        uvals = torch.empty_like(got)
        uvals[order] = got
        self._bytes["ids"] += 8 * self._off_rank(send_n)
        self._bytes["values"] += 4 * d * self._off_rank(recv_n)
        self._pending = {"order": order, "send_n": send_n, "recv_n": recv_n, "local": local}
        self._grad = None
        if self.training and torch.is_grad_enabled():
            leaf = uvals.requires_grad_()

            def capture(g: torch.Tensor) -> None:
                self._grad = g.detach()

            leaf.register_hook(capture)
            uvals = leaf
        # A competent user gathers with F.embedding: sort-based backward, no hot-row atomics.
        out = F.embedding(inv.view(b, f), uvals)
        t.mark("lookup")
        return out

    def after_backward(self) -> None:
        p, g = self._pending, self._grad
        self._pending, self._grad = None, None
        if p is None or g is None:
            raise RuntimeError(
                f"{self.name}: after_backward() without a forward + backward in training mode"
            )
        d = self.dim
        send_g = g[p["order"]]
        got = self._exchange(
            send_g, [n * d for n in p["send_n"]], [n * d for n in p["recv_n"]],
            "sharded gradient exchange",
        ).view(-1, d)  # fmt: skip
        self._bytes["gradients"] += 4 * d * self._off_rank(p["send_n"])
        self.timer.mark("exchange")
        # Rows asked for by several ranks appear several times: index_add_ sums them.
        self.weight.index_add_(0, p["local"], got, alpha=-self.lr)
        self.timer.mark("update")

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.owned_ids.cpu().clone(), self.weight.detach().cpu().clone()


class RowWise(AllToAllSharded):
    """(b) row ``i`` lives on rank ``i % world`` at local row ``i // world``."""

    name = "rowwise"

    def __init__(self, num_rows: int, dim: int, env: DistEnv, *, lr: float, seed: int) -> None:
        w, r = env.world_size, env.rank
        owned = torch.arange(r, int(num_rows), w, dtype=torch.int64, device=env.device)
        super().__init__(num_rows, dim, env, owned, lr=lr, seed=seed)

    def owner(self, ids: torch.Tensor) -> torch.Tensor:
        return ids % self.env.world_size

    def local(self, ids: torch.Tensor) -> torch.Tensor:
        return ids // self.env.world_size


def balance_tables(cards: np.ndarray, world: int) -> np.ndarray:
    """Owner of every field: largest first onto the rank with the fewest rows (LPT)."""
    owner = np.zeros(len(cards), dtype=np.int64)
    load = np.zeros(world, dtype=np.int64)
    for f in np.argsort(-np.asarray(cards), kind="stable"):
        j = int(np.argmin(load))
        owner[f] = j
        load[j] += int(cards[f])
    return owner


class TableWise(AllToAllSharded):
    """(c) whole fields per rank (balanced by rows); a rank stores its fields back to back."""

    name = "tablewise"

    def __init__(self, cards: np.ndarray, dim: int, env: DistEnv, *, lr: float, seed: int) -> None:
        cards = np.asarray(cards, dtype=np.int64)
        w, r = env.world_size, env.rank
        offsets = np.concatenate([[0], np.cumsum(cards)[:-1]]).astype(np.int64)
        f_owner = balance_tables(cards, w)
        base = np.zeros(len(cards), dtype=np.int64)  # local row of each field's first id
        filled = np.zeros(w, dtype=np.int64)
        for f in range(len(cards)):
            base[f] = filled[f_owner[f]]
            filled[f_owner[f]] += cards[f]
        mine = [f for f in range(len(cards)) if f_owner[f] == r]
        owned = (
            np.concatenate([np.arange(offsets[f], offsets[f] + cards[f]) for f in mine])
            if mine
            else np.zeros(0, dtype=np.int64)
        )
        dev = env.device
        super().__init__(
            int(cards.sum()), dim, env, torch.from_numpy(owned.astype(np.int64)), lr=lr, seed=seed
        )
        self.field_owner = f_owner
        self._bounds = torch.from_numpy(offsets[1:]).to(dev)  # field = #bounds <= id
        self._f_owner = torch.from_numpy(f_owner).to(dev)
        self._shift = torch.from_numpy(base - offsets).to(dev)  # local = id + shift[field]

    def _field(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(self._bounds, ids, right=True)

    def owner(self, ids: torch.Tensor) -> torch.Tensor:
        return self._f_owner[self._field(ids)]

    def local(self, ids: torch.Tensor) -> torch.Tensor:
        return ids + self._shift[self._field(ids)]


class HetGMP(Contender):
    """(d) :class:`DistributedEmbedding` (plan + store_rate + bound, or hash placement)."""

    def __init__(
        self, num_rows: int, dim: int, env: DistEnv, *, lr: float, seed: int, plan: Any = None,
        store_rate: float = 0.0, bound: int = 0, name: str = "hetgmp", replies: str = "stale",
        exchange: str = "exact",
    ) -> None:  # fmt: skip
        super().__init__(num_rows, dim, env)
        self.name = name
        self.emb = DistributedEmbedding(
            num_rows, dim, env, plan, placement="hash", store_rate=store_rate, bound=bound,
            optimizer="sgd", lr=lr, init_scale=INIT_SCALE, seed=seed, replies=replies,
            exchange=exchange,
        )  # fmt: skip
        if hasattr(self.emb, "peers_full"):  # (every rank's batch full: the pre-sync path)
            self.emb.peers_full(True)
        # The runtime's optional phase hook (hetgmp.embedding.profile); absent in older versions.
        self.hooked = hasattr(self.emb, "timer")
        self.prefetches = hasattr(self.emb, "prefetch")

    def prefetch(self, ids: torch.Tensor) -> None:
        self.emb.prefetch(ids)

    def set_timer(self, timer: Phases) -> None:
        self.timer = timer
        if self.hooked:
            self.emb.timer = timer

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.emb(ids)
        if not self.hooked:
            self.timer.mark("embedding")
        return out

    def bytes_sent(self) -> dict[str, int]:
        c = self.emb.counters()
        return {k: int(c.get(f"bytes_sent_{k}", 0)) for k in BYTE_KINDS}

    def counters(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.emb.counters().items() if k.startswith("rows_")}

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        sd = self.emb.state_dict()  # collective: flushes pending mirror deltas first
        return sd["ids"], sd["weight"]


CONTENDERS = ("torch", "rowwise", "tablewise", "hetgmp-hash", "hetgmp-b0", "hetgmp-b10",
              "hetgmp-b100", "hetgmp-b100-all", "hetgmp-b0-pad", "hetgmp-b10-pad",
              "hetgmp-b100-pad")  # fmt: skip


def build(
    name: str, *, cards: np.ndarray, dim: int, env: DistEnv, lr: float, seed: int,
    plan: Any = None, store_rate: float = 0.01,
) -> Contender:  # fmt: skip
    """Construct contender ``name`` (one of :data:`CONTENDERS`, or ``hetgmp`` on one rank)."""
    num_rows = int(np.asarray(cards).sum())
    if name == "torch":
        return TorchFused(num_rows, dim, env, lr=lr, seed=seed)
    if name == "rowwise":
        return RowWise(num_rows, dim, env, lr=lr, seed=seed)
    if name == "tablewise":
        return TableWise(cards, dim, env, lr=lr, seed=seed)
    if name in ("hetgmp", "hetgmp-hash"):
        return HetGMP(num_rows, dim, env, lr=lr, seed=seed, name=name)
    if name.startswith("hetgmp-b"):
        spec, replies, exchange = name[len("hetgmp-b") :], "stale", "exact"
        if spec.endswith("-all"):  # owners answer every mirror query: one size exchange
            spec, replies = spec[: -len("-all")], "all"
        elif spec.endswith("-pad"):  # + fixed-capacity payloads (CUDA graphs on GPU)
            spec, replies, exchange = spec[: -len("-pad")], "all", "padded"
        try:
            bound = int(spec)
        except ValueError:
            raise ValueError(f"contender {name!r}: expected hetgmp-b<bound>[-all|-pad]") from None
        if plan is None:
            raise ValueError(f"contender {name!r} needs a partition plan (world size > 1)")
        return HetGMP(
            num_rows, dim, env, lr=lr, seed=seed, plan=plan, store_rate=store_rate, bound=bound,
            name=name, replies=replies, exchange=exchange,
        )  # fmt: skip
    raise ValueError(f"unknown contender {name!r}; choose from {CONTENDERS} or hetgmp")
