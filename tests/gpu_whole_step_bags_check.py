"""Multi-hot bags on several CUDA ranks (issue 34): the captured multi-rank whole step against
the eager one, under torchrun.

Run by ``tests/test_whole_step_bags.py`` (GPU, 2 GPUs) as ``python -m torch.distributed.run
--standalone --nproc_per_node 2 tests/gpu_whole_step_bags_check.py DIR``: a generated set with
two multi-hot fields (rank 0 makes it), trained with ``multi_hot.GPU_RANKS`` on (the bags in
fixed shapes, the step one CUDA graph, NCCL inside it) and eagerly (``--no-cuda-graphs``), for
Adagrad at bound 0 and SGD at bound 100 (``gpu_whole_step_check.run``: it asserts which ran); every rank compares its rows, optimizer state and
dense layers and the row counters, and rank 0 prints ``WHOLE STEP BAGS CHECK OK``. With
``compact`` after ``DIR``: the bags' compact fixed lookup (``multi_hot.COMPACT``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from hetgmp.comm.collectives import barrier
from hetgmp.comm.launch import init_distributed, shutdown
from hetgmp.data.generate import generate_criteo_like
from hetgmp.train import multi_hot

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_whole_step_check import run  # noqa: E402

# (the model pools the bags; several CUDA ranks take them in fixed shapes: GPU_RANKS)
BAGS = dict(model="wdl", pooling="sum,mean", exchange="padded", replies="all")


def _gap(a: dict, b: dict) -> float:
    """The largest difference of two runs' rows."""
    return float((a["weight"] - b["weight"]).abs().max())


def compare(env: Any, root: Path) -> None:
    """GPU atomics add in any order, and bags sum many occurrences per row: two eager runs
    differ too. So the captured run must be as close to an eager one as two eager runs are to
    each other (and within the absolute tolerance where they agree); the run with planning
    ahead off is printed too, to tell a plan-ahead race from noise."""
    from hetgmp.embedding.padded import ahead

    multi_hot.GPU_RANKS = True
    for opt, bound in (("adagrad", 0), ("sgd", 100)):
        kw = dict(optimizer=opt, bound=bound, lr=0.05 if opt == "adagrad" else 5.0, **BAGS)
        g, e, e2 = (run(env, root, graphs, **kw) for graphs in (True, False, False))
        ahead.PLAN_AHEAD = False
        g0 = run(env, root, True, **kw)
        ahead.PLAN_AHEAD = True
        noise = _gap(e, e2)
        print(f"rank {env.rank} {opt} bound {bound}: |graph - eager| {_gap(g, e):.3g}, "
              f"|eager - eager| {noise:.3g}, |graph (no plan ahead) - eager| {_gap(g0, e):.3g}",
              flush=True)  # fmt: skip
        assert g["replays"] > 10, g["replays"]
        tol = max(1e-5, 4 * noise)
        torch.testing.assert_close(g["weight"], e["weight"], rtol=1e-4, atol=tol)
        torch.testing.assert_close(g["opt"], e["opt"], rtol=1e-4, atol=max(1e-6, 4 * noise))
        for k in e["dense"]:
            torch.testing.assert_close(g["dense"][k], e["dense"][k], rtol=1e-3, atol=tol)
        cg, ce = g["res"]["embedding_counters"], e["res"]["embedding_counters"]
        for k in ("rows_owned", "rows_mirror_fresh", "rows_remote", "pushes_sent"):
            assert cg[k] == ce[k], (opt, bound, k, cg[k], ce[k])
        print(f"rank {env.rank} {opt} bound {bound}: graph == eager ({g['replays']} replays)")


def main() -> int:
    env = init_distributed(device="cuda")
    root = Path(sys.argv[1])
    if env.rank == 0 and not (root / "meta.json").exists():
        generate_criteo_like(root, num_samples=40000, scale=0.002, seed=1, multi_hot="2:6",
                             progress=False)  # fmt: skip
    barrier(env)
    if "compact" in sys.argv[2:]:  # (the compact lookup, multi_hot.COMPACT; its capacity fixed
        # for both runs: the eager one has no epoch start that would set it)
        multi_hot.COMPACT, multi_hot.COMPACT_CAPACITY = True, 512 * 13
    else:  # (every slot padded: the eager run would never set the compact capacity)
        multi_hot.COMPACT = False
    compare(env, root)
    shutdown(env)
    if env.rank == 0:
        print("WHOLE STEP BAGS CHECK OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
