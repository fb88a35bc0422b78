"""The dense gradients' copy certified by the padded exchange's payload barriers
(``hetgmp/comm/barrier_rider.py``, ``peer_allreduce.SHARED_BARRIER`` with ``ADAM_COPY``)
against NCCL's all-reduce, under torchrun on 2 GPUs::

    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        tests/gpu_shared_barrier_check.py DIR

Both train the same generated data set (tests/gpu_whole_step_check.py's) with the dense Adam
(FlatAdam's kernel: the only optimizer that sums the ranks' buckets itself), whole-step CUDA
graphs and the next exchange right after backward; the shared run must have ridden the
exchange's barriers (counted: in the whole-step captures), then every rank compares its rows,
optimizer state and dense layers (on 2 ranks a + b == b + a: only the rows' GPU atomics differ
in the last bits); and the same with eager steps (the copy meets on its own there). Rank 0
prints ``SHARED BARRIER CHECK OK``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_whole_step_check import assert_same_state, checked, run  # noqa: E402

from hetgmp.comm import peer_allreduce  # noqa: E402


def _shared(env: Any, root: Path, graphs: bool, kw: dict) -> tuple[dict, int]:
    """A run with the copy riding the exchange's barriers; and how many steps it rode (the
    whole-step captures: a replay runs no host code)."""
    names = ("ADAM_PEER", "ADAM_COPY", "SHARED_BARRIER")
    old, rides = [getattr(peer_allreduce, n) for n in names], [0]
    ready = peer_allreduce.PeerAllReduce.ready

    def counted(self: Any, certified: Any = None) -> None:
        rides[0] += certified is not None
        ready(self, certified)

    for n in names:
        setattr(peer_allreduce, n, True)
    peer_allreduce.PeerAllReduce.ready = counted  # type: ignore[method-assign]
    try:
        return run(env, root, graphs, **kw), rides[0]
    finally:
        peer_allreduce.PeerAllReduce.ready = ready  # type: ignore[method-assign]
        for n, v in zip(names, old, strict=True):
            setattr(peer_allreduce, n, v)


def compare(env: Any, root: Path) -> None:
    kw = dict(optimizer="adagrad", bound=100, lr=0.05, dense_optimizer="adam", dense_lr=0.01)
    for graphs in (True, False):
        base = run(env, root, graphs, **kw)
        shared, rides = _shared(env, root, graphs, kw)
        if graphs:
            assert shared["replays"] > 10 and rides > 0, (shared["replays"], rides)
        assert_same_state(shared, base)
        print(f"rank {env.rank} graphs {graphs}: shared == all-reduce ({rides} rides)", flush=True)


if __name__ == "__main__":
    sys.exit(checked(compare, "SHARED BARRIER CHECK OK"))
