"""Loops calling the table directly (no trainer) on GPUs, under torchrun: the cases of
``tests/test_uneven_presync.py::test_custom_loops_meet_their_peers_in_one_path`` with NCCL and
the payloads in symmetric memory, where ranks that take different paths wait for each other
until NCCL's watchdog (on gloo ranks both paths still meet).

``python -m torch.distributed.run --standalone --nproc_per_node 2 tests/gpu_custom_loop_check.py
DIR``: never told whether batches are full, with unequal batch sizes (no pre-sync, equal to
the exact transport); told full with equal batches (the pre-sync path runs); capacities fixed,
a batch over them on one rank (every rank goes exact together); told full, float ids on one
rank (every rank fails at that step). Rank 0 prints ``CUSTOM LOOP CHECK OK``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from gpu_whole_step_check import checked
from test_uneven_presync import _custom_loops


def compare(env: Any, root: Path) -> None:  # noqa: ARG001 - (checked's data set: unused)
    r = _custom_loops(env, None)
    assert r["uneven_padded"]["presynced"] == [0] * 8, r["uneven_padded"]["presynced"]
    assert sum(r["told_even"]["presynced"]) >= 4, r["told_even"]["presynced"]
    assert r["over_padded"]["built"] >= 1, r["over_padded"]
    for p, e in (("uneven_padded", "uneven_exact"), ("over_padded", "over_exact")):
        for k, v in r[e]["sd"].items():  # (GPU atomics add in any order: the last bits)
            torch.testing.assert_close(r[p]["sd"][k], v, rtol=1e-4, atol=1e-5, msg=k)
    for o in ("sgd", "adagrad"):
        bad = r[f"bad_{o}"]
        assert bad["error"] is not None and bad["presynced"], (env.rank, o, bad)
    print(f"rank {env.rank}: custom loops in one path", flush=True)


if __name__ == "__main__":
    sys.exit(checked(compare, "CUSTOM LOOP CHECK OK"))
