"""The dense gradients summed by Adam in peer memory (``hetgmp.comm.peer_allreduce.ADAM_PEER``):
on spawned gloo ranks whose buckets are shared-memory peer buffers, the fused kernel (Triton's
interpreter) reads every rank's gradient, adds them in rank order and steps Adam. Every rank's
parameters come out bit-identical, and equal to ``torch.optim.Adam`` on the summed gradient.
(CUDA: ``tests/gpu_dense_allreduce_check.py`` on 2 GPUs.)"""

from __future__ import annotations

import pytest
import torch
from test_whole_step_multi import interpreter_now
from torch import nn

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks

SHAPES = [(37, 50), (50,), (3, 1000), (1,)]  # (5,401 floats: 3 programs, the last partial)


def _grad(step: int, rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _init() -> list[nn.Parameter]:
    g = torch.Generator().manual_seed(7)
    return [nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]


def _steps(env: DistEnv, steps: int, copied: bool = False) -> dict:
    interpreter_now()
    from hetgmp.comm.peer_allreduce import PeerAllReduce
    from hetgmp.train.flat_adam import FlatAdam, flatten_parameters

    params = _init()
    flat = flatten_parameters(params)
    peer = PeerAllReduce(env, flat.numel(), torch.float32, in_optimizer=True, copied=copied)
    opt = FlatAdam(params, flat, peer.flat, lr=0.01, fused="triton", peer_grads=peer.bases)
    ref_params = _init()
    ref = torch.optim.Adam(ref_params, lr=0.01)
    for step in range(steps):
        peer.flat.copy_(torch.cat([g.reshape(-1) for g in _grad(step, env.rank)]))
        peer.ready()  # (every rank's gradient complete: copied into the inboxes, a barrier)
        opt.step()
        peer.barrier()  # (every rank done reading before any bucket changes)
        peer.flat.zero_()
        for i, p in enumerate(ref_params):  # (the sum in rank order, as the kernel adds)
            p.grad = sum((_grad(step, r)[i] for r in range(env.world_size)), torch.zeros(SHAPES[i]))
        ref.step()
    return {"flat": flat.clone(), "ref": torch.cat([p.detach().reshape(-1) for p in ref_params])}


# (both switches are off since measured, bench/results/gpu/adam_copy/: two ranks copied in the
# suite; three ranks reading their peers' buckets, ~7 s more, under -m slow)
@pytest.mark.parametrize(
    ("world", "copied"), [(2, True), pytest.param(3, False, marks=pytest.mark.slow)]
)
def test_adam_sums_every_ranks_gradient_in_peer_memory(world: int, copied: bool) -> None:
    """``copied``: each bucket copied into every peer's inbox first, Adam reading local
    memory only (``ADAM_COPY``); the sums in rank order alike."""
    pytest.importorskip("triton")
    outs = spawn_ranks(_steps, world, 3, copied, timeout_s=120, start_method="spawn")
    for o in outs[1:]:
        assert torch.equal(o["flat"], outs[0]["flat"])  # (the same adds on every rank)
    torch.testing.assert_close(outs[0]["flat"], outs[0]["ref"], rtol=1e-5, atol=1e-6)
    # (and not this rank's gradient alone: the parameters moved by the sum)
    assert not torch.allclose(outs[0]["flat"], _init_alone(world), rtol=1e-5, atol=1e-6)


def _init_alone(world: int) -> torch.Tensor:
    """Rank 0's parameters had Adam stepped on its own gradient only (what a kernel that
    read no peer would give)."""
    params = _init()
    opt = torch.optim.Adam(params, lr=0.01)
    for step in range(3):
        for p, g in zip(params, _grad(step, 0), strict=True):
            p.grad = g
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in params])
