"""The dense gradients' all-reduce in peer memory (:mod:`hetgmp.comm.peer_allreduce`): where it
cannot run (gloo ranks, one process, the switch off) the bucket keeps the group's all-reduce
and says why, with the same sums; on 2 GPUs it equals NCCL's all-reduce bit for bit
(``tests/gpu_dense_allreduce_check.py``)."""

from __future__ import annotations

import pytest
import torch

from hetgmp.comm import peer_allreduce
from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.train.dense_sync import GradBucket


def _bucket(env: DistEnv, on: bool) -> dict:
    peer_allreduce.DENSE_PEER = on
    layer = torch.nn.Linear(6, 3)
    torch.manual_seed(env.rank)
    bucket = GradBucket(env, list(layer.parameters()))
    layer(torch.randn(4, 6)).sum().backward()
    bucket.all_reduce()
    return {"how": bucket.how, "peer": bucket.peer is not None, "flat": bucket.flat.clone()}


@pytest.mark.parametrize("on", [False, True])
def test_gloo_ranks_keep_the_groups_all_reduce(on: bool) -> None:
    outs = spawn_ranks(_bucket, 2, on, timeout_s=60)
    assert not any(o["peer"] for o in outs)
    assert torch.equal(outs[0]["flat"], outs[1]["flat"])  # (summed: the same on both)
    want = "CUDA ranks on NCCL" if on else "the group's all-reduce"
    assert all(want in o["how"] for o in outs), outs[0]["how"]


def test_one_process_has_nothing_to_sum() -> None:
    peer_allreduce.DENSE_PEER = True
    try:
        got, how = peer_allreduce.peer_all_reduce(DistEnv.single(), 10, torch.float32)
    finally:
        peer_allreduce.DENSE_PEER = False
    assert got is None and how == "the group's all-reduce"


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_dense_allreduce_on_two_gpus(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two-shot in peer memory == NCCL, eager and in a CUDA graph, and in a bucket."""
    from test_whole_step_multi import _torchrun_check

    _torchrun_check("gpu_dense_allreduce_check.py", tmp_path, "DENSE ALLREDUCE CHECK OK")
