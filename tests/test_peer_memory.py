"""Peer memory (:mod:`hetgmp.comm.peer_memory`) on spawned gloo ranks: every rank reads every
peer's buffers and writes into them in place, a barrier makes the writes visible, the views
keep their dtypes and shapes, nothing is left in ``/dev/shm``, and what cannot share peer
memory is refused with the reason. (CUDA: ``tests/gpu_peer_memory_check.py`` on 2 GPUs.)"""

from __future__ import annotations

import os

import pytest
import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.peer_memory import PeerMemory, why_not
from hetgmp.comm.spawn import spawn_ranks

LAYOUT = {"rows": ((50, 8), torch.float32), "inbox": ((3, 50, 8), torch.float32),
          "count": ((3,), torch.int64)}  # fmt: skip


def _exchange(env: DistEnv) -> dict:
    pm = PeerMemory(env, LAYOUT)
    r, w = env.rank, env.world_size
    assert all(float(pm.peer("rows", p).abs().sum()) == 0 for p in range(w))  # (zeroed)
    pm.barrier()  # (every rank has looked before any writes)
    pm.mine("rows").copy_(torch.arange(400.0).view(50, 8) + 1000 * r)
    pm.barrier()
    seen = [pm.peer("rows", p)[7, :2].tolist() for p in range(w)]
    # every rank writes into each peer's inbox row of its own (no two writers share a row)
    for p in range(w):
        pm.peer("inbox", p)[r, r + 1].fill_(10.0 * r + p)
        pm.peer("count", p)[r] = r + 1
    pm.barrier()
    return {"seen": seen, "inbox": pm.mine("inbox")[:, :, 0].clone(),
            "count": pm.mine("count").tolist(), "dtype": str(pm.mine("count").dtype),
            "files": [f for f in pm.paths if os.path.exists(f)]}  # fmt: skip


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_read_and_write_each_others_buffers(world: int) -> None:
    outs = spawn_ranks(_exchange, world, timeout_s=60)
    for r, o in enumerate(outs):
        assert o["seen"] == [[56.0 + 1000 * p, 57.0 + 1000 * p] for p in range(world)]
        for q in range(world):  # (rank q wrote row q + 1 of slot q)
            assert float(o["inbox"][q, q + 1]) == 10.0 * q + r
            assert float(o["inbox"][q].sum()) == 10.0 * q + r  # (and nothing else)
        assert o["count"][:world] == list(range(1, world + 1)) and o["dtype"] == "torch.int64"
        assert o["files"] == []  # (unlinked once mapped)


def test_what_cannot_share_peer_memory_is_refused() -> None:
    assert why_not(DistEnv.single()) == "a single process"
    from hetgmp.comm.peer_memory import PeerMemoryRefused

    with pytest.raises(PeerMemoryRefused, match="one host: a single process"):
        PeerMemory(DistEnv.single(), LAYOUT)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_peer_memory_on_two_gpus(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Symmetric memory over NVLink: the same reads and writes, the barrier eager and inside a
    CUDA graph (tests/gpu_peer_memory_check.py under torchrun)."""
    from test_whole_step_multi import _torchrun_check

    _torchrun_check("gpu_peer_memory_check.py", tmp_path, "PEER MEMORY CHECK OK")


def _one_rank_fails(env: DistEnv) -> dict:
    """Rank 1 cannot make its shared-memory file: every rank is told (none waits for it), and
    the padded exchange then takes the all-to-alls on every rank."""
    import hetgmp.comm.peer_memory as pm_mod
    from hetgmp.embedding.padded import peer_payloads

    real, made = torch.from_file, []

    def broken(*a, **kw):  # type: ignore[no-untyped-def]
        if env.rank == 1:
            raise RuntimeError("No space left on device")
        made.append(a[0])
        return real(*a, **kw)

    torch.from_file = broken  # type: ignore[assignment]
    try:
        with pytest.raises(pm_mod.PeerMemoryUnavailable, match=r"on rank\(s\) \[1\]") as err:
            PeerMemory(env, LAYOUT)
        peer_payloads.PEER_PAYLOADS = peer_payloads.ON_CPU = True
        with pytest.warns(UserWarning, match="take NCCL's all-to-alls"):
            got, note = peer_payloads.peer_payloads(env, 512, 512, direct=False)
    finally:
        torch.from_file = real  # type: ignore[assignment]
    return {"msg": str(err.value), "peer": got is None and "no peer memory" in note,
            "files": [f for f in made if os.path.exists(f)]}  # fmt: skip


def test_a_rank_that_cannot_allocate_fails_every_rank_alike() -> None:
    outs = spawn_ranks(_one_rank_fails, 2, timeout_s=60)
    assert all(o["peer"] for o in outs) and outs[0]["files"] == []  # (rank 0's file removed)
    assert "No space left on device" in outs[1]["msg"] and "rank(s) [1]" in outs[0]["msg"]
