"""Adam over one flat buffer: the dense parameters, their gradients and both moments as views
into four flat tensors, updated by a few whole-buffer ops.

Why: torch's fused Adam splits every tensor into chunks of 65536 elements and gives each chunk
one thread block; WDL-128's dense part (about 1M floats, 90 % of it in one weight) makes ~16
blocks on a 132-multiprocessor GPU, and its step took 77 us on an H200 -- 10 % of a batch-8192
training step -- for ~28 MB of traffic. A handful of elementwise ops over the flat buffers
spread over the whole chip (the step is replayed in a CUDA graph, so their launches cost no
host time).

It is ``torch.optim.Adam`` (no weight decay, no amsgrad) with the same arithmetic up to float
rounding, capturable (the step count lives on the device), and its ``state_dict`` is Adam's:
checkpoints load into either class. The parameters must be views of one flat buffer
(:func:`flatten_parameters`) and their gradients views of another
(:class:`~hetgmp.train.dense_sync.GradBucket`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetgmp.train.adam_kernel import adam_flat_step, adam_peer_step, fused_adam_available


def flatten_parameters(params: list[nn.Parameter]) -> torch.Tensor:
    """Move ``params``' values into one flat buffer and make each parameter a view of it (the
    values are unchanged); returns the buffer."""
    flat = torch.cat([p.detach().reshape(-1) for p in params]) if params else torch.zeros(0)
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat[offset : offset + n].view_as(p)
        offset += n
    return flat


class FlatAdam(torch.optim.Adam):
    """``torch.optim.Adam(params, lr, betas, eps)`` on flat buffers (see the module docstring):
    ``flat_params`` holds every parameter, ``flat_grads`` every gradient, in the same order.
    ``fused``: ``auto`` (one Triton kernel per step on CUDA), ``triton`` or ``torch``."""

    def __init__(
        self, params: list[nn.Parameter], flat_params: torch.Tensor, flat_grads: torch.Tensor,
        *, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
        fused: str = "auto", peer_grads: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        super().__init__(params, lr=lr, betas=betas, eps=eps, capturable=True)
        self.flat_params, self.flat_grads = flat_params, flat_grads
        # the gradient: the sum of every rank's bucket in peer memory, read by the kernel
        # (their addresses: hetgmp.comm.peer_allreduce.ADAM_PEER), or flat_grads
        self.peer_grads = peer_grads
        # one Triton kernel per step (hetgmp.train.adam_kernel) or the torch ops below
        self.fused = fused_adam_available(flat_params.device, fused)
        if peer_grads is not None and not self.fused:
            raise ValueError("FlatAdam: peer_grads needs the fused kernel (fused='triton')")
        self.exp_avg = torch.zeros_like(flat_params)
        self.exp_avg_sq = torch.zeros_like(flat_params)
        self.step_t = torch.zeros((), dtype=torch.float32, device=flat_params.device)
        self._point_state()

    def _point_state(self) -> None:
        """Every parameter's Adam state as views of the flat moments (what state_dict saves)."""
        offset = 0
        for p in self.param_groups[0]["params"]:
            n = p.numel()
            self.state[p] = {
                "step": self.step_t,
                "exp_avg": self.exp_avg[offset : offset + n].view_as(p),
                "exp_avg_sq": self.exp_avg_sq[offset : offset + n].view_as(p),
            }
            offset += n

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """One Adam step on the flat buffers (no host sync; capturable)."""
        group = self.param_groups[0]
        b1, b2 = group["betas"]
        lr, eps = group["lr"], group["eps"]
        g, m, v = self.flat_grads, self.exp_avg, self.exp_avg_sq
        self.step_t += 1
        if self.peer_grads is not None:
            adam_peer_step(self.flat_params, self.peer_grads, m, v, self.step_t, lr=lr, b1=b1,
                           b2=b2, eps=eps)  # fmt: skip
            return
        if self.fused:
            adam_flat_step(self.flat_params, g, m, v, self.step_t, lr=lr, b1=b1, b2=b2, eps=eps)
            return
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1 = 1 - torch.pow(b1, self.step_t)
        bc2_sqrt = (1 - torch.pow(b2, self.step_t)).sqrt()
        denom = (v.sqrt() / bc2_sqrt).add_(eps)
        self.flat_params.addcdiv_(m, denom * (bc1 / -lr))

    def state_dict(self) -> dict[str, Any]:
        """Adam's state dict, marked not capturable (the flag is this class's own business: a
        CPU ``torch.optim.Adam`` refuses to step with it). The moments are views of the flat
        buffers: save it (or copy it) before the next step changes them."""
        sd = super().state_dict()
        # one step tensor per parameter, as Adam keeps it (Adam adds 1 to each in place: a
        # shared one would count every step once per parameter)
        sd["state"] = {i: {**st, "step": st["step"].clone()} for i, st in sd["state"].items()}
        sd["param_groups"] = [{**g, "capturable": False} for g in sd["param_groups"]]
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Adam's state dict (of this class or ``torch.optim.Adam`` over the same parameters);
        the loaded moments are copied into the flat buffers."""
        super().load_state_dict(state_dict)
        loaded = [self.state.get(p, {}) for p in self.param_groups[0]["params"]]
        offset = 0
        for p, st in zip(self.param_groups[0]["params"], loaded, strict=True):
            n = p.numel()
            for key, flat in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
                if key in st:
                    flat[offset : offset + n].copy_(st[key].reshape(-1))
            offset += n
        steps = [st["step"] for st in loaded if "step" in st]
        if steps:
            self.step_t.copy_(torch.as_tensor(steps[0], dtype=torch.float32))
        self.param_groups[0]["capturable"] = True
        self._point_state()
