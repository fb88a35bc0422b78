"""The dense gradients' all-reduce in peer memory (:mod:`hetgmp.comm.peer_allreduce`) on CUDA
ranks under torchrun: ``python -m torch.distributed.run --standalone --nproc_per_node 2
tests/gpu_dense_allreduce_check.py``. Each rank's random gradients summed by the two-shot kernel
equal NCCL's all-reduce of the same values (bit for bit on 2 ranks: a sum of two floats has one
rounding), eagerly and replayed in a CUDA graph, for an odd length (padding); a
:class:`GradBucket` with the switch on sums its parameters' gradients there. Rank 0 prints
``DENSE ALLREDUCE CHECK OK``. Also the gradients summed by Adam itself in peer memory
(``peer_allreduce.ADAM_PEER``): the parameters equal NCCL's all-reduce followed by the same
fused Adam, eagerly and in a CUDA graph, with the buckets read in the peers' memory and copied
into each rank's inbox first (``peer_allreduce.ADAM_COPY``)."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from hetgmp.comm import peer_allreduce
from hetgmp.comm.launch import init_distributed, shutdown
from hetgmp.train.dense_sync import GradBucket

N = 990_735  # (WDL dim 128's dense parameters: not a multiple of the kernel's quantum)


def main() -> int:
    env = init_distributed(device="cuda")
    r, w, dev = env.rank, env.world_size, env.device
    peer_allreduce.DENSE_PEER = True
    ar, how = peer_allreduce.peer_all_reduce(env, N, torch.float32)
    assert ar is not None, how
    gen = torch.Generator(device=dev).manual_seed(1234 + r)
    values = [torch.randn(N, device=dev, generator=gen) for _ in range(4)]
    want = [v.clone() for v in values]
    for v in want:
        dist.all_reduce(v, group=env.group)
    ar.flat.copy_(values[0])
    ar.all_reduce()  # (eagerly: also the first use before any capture)
    torch.cuda.synchronize()
    exact = w == 2
    check(ar.flat, want[0], exact, "eager")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ar.all_reduce()
    for k in (1, 2, 3):
        ar.flat.copy_(values[k])
        graph.replay()
        torch.cuda.synchronize()
        check(ar.flat, want[k], exact, f"replay {k}")
    bucket_check(env, exact)
    adam_peer_check(env, exact, copied=False)
    adam_peer_check(env, exact, copied=True)
    shutdown(env)
    if r == 0:
        print(f"DENSE ALLREDUCE CHECK OK ({how}; {w} ranks, bitwise: {exact})", flush=True)
    return 0


def check(got: torch.Tensor, want: torch.Tensor, exact: bool, what: str) -> None:
    if exact:
        assert torch.equal(got, want), (what, float((got - want).abs().max()))
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=what)


def bucket_check(env, exact: bool) -> None:  # type: ignore[no-untyped-def]
    """A bucket's gradients (views into peer memory) summed over ranks."""
    layer = torch.nn.Linear(33, 7, device=env.device)
    bucket = GradBucket(env, list(layer.parameters()))
    assert bucket.peer is not None, bucket.how
    x = torch.randn(5, 33, device=env.device) * (env.rank + 1)
    layer(x).square().sum().backward()
    local = [p.grad.clone() for p in layer.parameters()]
    for g in local:
        dist.all_reduce(g, group=env.group)
    bucket.all_reduce()
    torch.cuda.synchronize()
    for p, g in zip(layer.parameters(), local, strict=True):
        check(p.grad, g, exact, "bucket")


def adam_peer_check(env, exact: bool, *, copied: bool) -> None:  # type: ignore[no-untyped-def]
    """Three Adam steps with the gradients summed by the kernel from peer memory (the first
    eager, the others a CUDA graph's replays: barrier, step, barrier, zero) against NCCL's
    all-reduce then the same fused Adam on a copy of the parameters (``copied``: the buckets
    copied into the peers' inboxes first, ``peer_allreduce.ADAM_COPY``)."""
    from hetgmp.train.flat_adam import FlatAdam, flatten_parameters

    peer_allreduce.ADAM_PEER = True
    peer_allreduce.ADAM_COPY = copied
    dev = env.device
    torch.manual_seed(5)  # (the same parameters on every rank)
    mine, ref = (torch.nn.Linear(1000, 990, device=dev) for _ in range(2))
    ref.load_state_dict(mine.state_dict())
    pm, pr = list(mine.parameters()), list(ref.parameters())
    fm, fr = flatten_parameters(pm), flatten_parameters(pr)
    bucket = GradBucket(env, pm, adam=True)
    assert bucket.peer_grads is not None, bucket.how
    assert bucket.peer is not None and bucket.peer.copied == copied, bucket.how
    grads = torch.zeros_like(fr)
    opt = FlatAdam(pm, fm, bucket.flat, lr=0.01, peer_grads=bucket.peer_grads)
    ropt = FlatAdam(pr, fr, grads, lr=0.01)
    gen = torch.Generator(device=dev).manual_seed(99 + env.rank)
    values = [torch.randn(fm.numel(), device=dev, generator=gen) for _ in range(3)]

    def step() -> None:
        bucket.all_reduce()  # (a barrier: Adam sums)
        opt.step()
        bucket.zero_()  # (after a barrier)

    graph = None
    for k, v in enumerate(values):
        bucket.flat.copy_(v)
        if k == 0:
            step()
        else:
            if graph is None:
                graph = torch.cuda.CUDAGraph()
                torch.cuda.synchronize()
                with torch.cuda.graph(graph):
                    step()
                bucket.flat.copy_(v)  # (capturing ran nothing)
            graph.replay()
        grads.copy_(v)
        dist.all_reduce(grads, group=env.group)
        ropt.step()
        torch.cuda.synchronize()
        check(fm, fr, exact, f"adam step {k} (copied: {copied})")
        assert float(bucket.flat.abs().sum()) == 0.0  # (zeroed after every rank read it)
    peer_allreduce.ADAM_PEER = peer_allreduce.ADAM_COPY = False


if __name__ == "__main__":
    sys.exit(main())
