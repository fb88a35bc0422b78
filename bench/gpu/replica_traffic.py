"""Diagnosis only (``ablations.py``'s ``replica_*``): a lean 2-GPU step's least row traffic
added to the ``replica`` step (every rank the whole table and one GPU's embedding step), to
learn what moving it costs wherever it runs (``bench/results/gpu/lean_ceiling_s22/``). The
rows are random and fixed (what today's counters say a rank moves a step at batch 8192):
``ABL_PUSH_ROWS`` (1100) rows out and added into the receiver's table, ``ABL_REPLY_ROWS`` (800)
rows out and copied into it. Wrong values: a diagnosis, never a figure.

Transports: ``nccl`` (two all-to-alls), ``peer`` (rows written straight into the peer's
buffers, a device barrier after each half), ``peer1`` (both halves, one barrier), ``flag``
(both halves a step late, a one-way flag instead of a barrier: :mod:`flag_triton`). Placements:
after the own rows' update (in the step's tail), or ``ahead`` on a side stream beside the
forward and backward (joined before the update).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


class Traffic:
    """The rows each step moves and the buffers they move through (made at the first step,
    a warm-up step before any capture)."""

    def __init__(self, transport: str) -> None:
        self.transport = transport
        self.k1 = int(os.environ.get("ABL_PUSH_ROWS", 1100))
        self.k2 = int(os.environ.get("ABL_REPLY_ROWS", 800))
        self.idx: list[torch.Tensor] = []
        self.recv: tuple[torch.Tensor, torch.Tensor] | None = None
        self.pm: Any = None
        self.seq: torch.Tensor | None = None
        self.peer_addr: torch.Tensor | None = None  # (flag: the peer's flag's address)

    def ready(self, step: Any) -> None:
        if self.idx:
            return
        from hetgmp.comm.peer_memory import PeerMemory

        env, w = step.ctx.env, step.weight
        ws = env.world_size if self.transport == "nccl" else 1  # (an all-to-all's share each)
        g = torch.Generator().manual_seed(1)
        self.idx = [
            torch.randint(0, w.shape[0], (k * ws,), generator=g).to(w.device)
            for k in (self.k1, self.k1, self.k2, self.k2)
        ]
        d = w.shape[1]
        if self.transport == "nccl":
            self.recv = (w.new_empty(self.k1 * ws, d), w.new_empty(self.k2 * ws, d))
            return
        lay = {"push": ((self.k1, d), w.dtype), "reply": ((self.k2, d), w.dtype)}
        if self.transport == "flag":
            lay["flag"] = ((1,), torch.int64)
            self.seq = torch.zeros(1, dtype=torch.int64, device=w.device)
        self.pm = PeerMemory(env, lay)
        if self.transport == "flag":
            import flag_triton

            peer_flag = self.pm.peer("flag", (env.rank + 1) % env.world_size)
            self.peer_addr = flag_triton.address_of(peer_flag, w.device)

    def run(self, step: Any) -> None:
        """This step's traffic (``flag``: the last step's taken, this step's sent)."""
        self.ready(step)
        getattr(self, f"_{self.transport}")(step.weight, step.ctx.env)

    def _nccl(self, w: torch.Tensor, env: Any) -> None:
        (src, dst, rsrc, rdst), (recv, rrecv) = self.idx, self.recv  # type: ignore[misc]
        dist.all_to_all_single(recv, w.index_select(0, src), group=env.group)
        w.index_add_(0, dst, recv, alpha=-0.01)
        dist.all_to_all_single(rrecv, w.index_select(0, rsrc), group=env.group)
        w.index_copy_(0, rdst, rrecv)

    def _send(self, w: torch.Tensor, env: Any, half: str) -> None:
        src = self.idx[0] if half == "push" else self.idx[2]
        torch.index_select(w, 0, src, out=self.pm.peer(half, (env.rank + 1) % env.world_size))

    def _take(self, w: torch.Tensor, half: str) -> None:
        if half == "push":
            w.index_add_(0, self.idx[1], self.pm.mine("push"), alpha=-0.01)
        else:
            w.index_copy_(0, self.idx[3], self.pm.mine("reply"))

    def _peer(self, w: torch.Tensor, env: Any) -> None:
        for half in ("push", "reply"):
            self._send(w, env, half)
            self.pm.barrier()
            self._take(w, half)

    def _peer1(self, w: torch.Tensor, env: Any) -> None:
        # (a step's writes may race the peer's reads of the last step's: one buffer, not two)
        self._send(w, env, "push")
        self._send(w, env, "reply")
        self.pm.barrier()
        self._take(w, "push")
        self._take(w, "reply")

    def flag_take(self, step: Any) -> None:
        """(``flag``, before the own rows' update) the rows the peer sent a step ago."""
        import flag_triton

        self.ready(step)
        flag_triton.wait(self.pm.mine("flag"), self.seq)
        self._take(step.weight, "push")
        self._take(step.weight, "reply")

    def _flag(self, w: torch.Tensor, env: Any) -> None:
        import flag_triton

        assert self.seq is not None
        self.seq.add_(1)
        self._send(w, env, "push")
        self._send(w, env, "reply")
        flag_triton.signal(self.peer_addr, self.seq)


def install(transport: str, ahead: bool) -> None:
    """Patch the one-rank step to move ``transport``'s traffic each step (module docstring)."""
    from hetgmp.embedding import local

    traffic, side = Traffic(transport), {}
    orig_apply, orig_step = local.LocalStep._apply, local.LocalStep.step

    def apply_after(step: Any, pb: Any, pg: Any) -> None:  # (in the step's tail)
        # (the flag's kernels need CUDA: on CPU, a smoke run, that one moves nothing)
        moves = pb.lead is not None and (transport != "flag" or step.weight.is_cuda)
        if moves and transport == "flag":
            traffic.flag_take(step)
        orig_apply(step, pb, pg)
        if moves:
            traffic.run(step)

    def step_ahead(step: Any, ids: Any, **kw: Any) -> Any:  # (beside the forward)
        if ids.numel() and torch.cuda.is_available():
            traffic.ready(step)  # (not on the side stream)
            s = side.setdefault("s", torch.cuda.Stream())
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                traffic.run(step)
            side["open"] = True
        return orig_step(step, ids, **kw)

    def apply_joined(step: Any, pb: Any, pg: Any) -> None:
        if side.pop("open", False):
            torch.cuda.current_stream().wait_stream(side["s"])
        orig_apply(step, pb, pg)

    if ahead:
        local.LocalStep.step = step_ahead  # type: ignore[method-assign]
        local.LocalStep._apply = apply_joined  # type: ignore[method-assign]
    else:
        local.LocalStep._apply = apply_after  # type: ignore[method-assign]
