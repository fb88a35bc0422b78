"""Peer memory on CUDA (:mod:`hetgmp.comm.peer_memory`, symmetric memory over NVLink) under
torchrun: ``python -m torch.distributed.run --standalone --nproc_per_node 2
tests/gpu_peer_memory_check.py``. Every rank reads every peer's rows, adds into each peer's
inbox with our scatter-add kernel (its own row of it), and the barrier makes the writes
visible, eagerly and replayed in a CUDA graph; rank 0 prints ``PEER MEMORY CHECK OK``."""

from __future__ import annotations

import sys

import torch

from hetgmp.comm.launch import init_distributed, shutdown
from hetgmp.comm.peer_memory import PeerMemory
from hetgmp.embedding.kernels import scatter_add_rows, take_rows

LAYOUT = {"rows": ((4096, 128), torch.float32), "inbox": ((8, 4096, 128), torch.float32)}


def main() -> int:
    env = init_distributed(device="cuda")
    pm = PeerMemory(env, LAYOUT)
    r, w, dev = env.rank, env.world_size, env.device
    pm.mine("rows").copy_(torch.arange(4096.0, device=dev)[:, None].expand(4096, 128) + 1e4 * r)
    pm.barrier()
    idx = torch.arange(0, 4096, 7, device=dev)
    for p in range(w):  # remote gathers by the row kernel
        got = take_rows(pm.peer("rows", p), idx, backend="triton")
        assert torch.equal(got[:, 0], idx.float() + 1e4 * p), p
    ones = torch.ones(idx.numel(), 128, device=dev)

    def push() -> None:  # every rank adds into its own row block of each peer's inbox
        for p in range(w):
            scatter_add_rows(pm.peer("inbox", p)[r], idx, ones, backend="triton")
        pm.barrier(channel=1)

    push()  # (eagerly: also the first barrier on the channel, before any capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        push()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    inbox = pm.mine("inbox")
    for q in range(w):
        assert torch.equal(inbox[q][idx], torch.full_like(inbox[q][idx], 4.0)), q
        assert float(inbox[q].sum()) == 4.0 * idx.numel() * 128, q
    pm.barrier()
    torch.cuda.synchronize()
    dropped_during_capture(env)
    shutdown(env)
    if r == 0:
        print("PEER MEMORY CHECK OK", flush=True)
    return 0


def dropped_during_capture(env) -> None:  # type: ignore[no-untyped-def]
    """A PeerMemory dropped while a CUDA graph captures (a trainer's exchange collected by
    Python's cycle collector during the next one's capture) must not free its memory then:
    that aborted the process ("operation not permitted when stream is capturing")."""
    import gc

    old = PeerMemory(env, LAYOUT)
    x = torch.zeros(8, device=env.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
        del old
        gc.collect()
    graph.replay()
    torch.cuda.synchronize()
    new = PeerMemory(env, LAYOUT)  # (frees what the capture kept)
    new.barrier()
    torch.cuda.synchronize()
    assert float(x.sum()) == 8.0


if __name__ == "__main__":
    sys.exit(main())
