"""The multi-rank whole-step CUDA graph against the eager padded step, under torchrun.

Run by ``tests/test_whole_step_multi.py`` (GPU, 2 GPUs) as ``python -m torch.distributed.run
--standalone --nproc_per_node 2 tests/gpu_whole_step_check.py DIR``: both train the same
generated data set on NCCL (Adagrad and SGD rows, bound 0 and 100, samples resident on the
device), one replaying its whole step as one CUDA graph, the other eagerly (``--no-cuda-graphs``);
every rank compares its owned rows, optimizer state, the dense layers and the row counters, and
rank 0 prints ``WHOLE STEP CHECK OK``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetgmp.comm.collectives import barrier
from hetgmp.comm.launch import init_distributed, shutdown
from hetgmp.config import validate
from hetgmp.data.format import make_fields, write_dataset
from hetgmp.train.config import TrainConfig
from hetgmp.train.graphed_multi import MultiRankGraphedStep
from hetgmp.train.run import build_trainer, distributed_embedding
from hetgmp.train.runlog import RunLog

CARDS = [50, 2000, 300, 7000, 40, 900, 5000, 12]


def make_data(root: Path) -> Path:
    """Zipf-like ids (hot rows repeat within a batch), 8 fields, 12k samples."""
    rng = np.random.default_rng(3)
    fields = make_fields([f"f{i}" for i in range(len(CARDS))], CARDS)
    offs = np.array([f.offset for f in fields])

    def split(n: int):
        local = np.stack([np.minimum(rng.zipf(1.3, n) - 1, c - 1) for c in CARDS], axis=1)
        dense = rng.random((n, 3), dtype=np.float32)
        return local + offs, dense, (rng.random(n) < 0.3).astype(np.float32)

    if not (root / "meta.json").exists():
        write_dataset(root, fields, {"train": split(12000), "test": split(1000)}, num_dense=3)
    return root


def run(env, root: Path, graphs: bool, **kw) -> dict:
    cfg = validate(
        TrainConfig(
            dataset=str(root),
            batch_size=512,
            embed_dim=16,
            progress=False,
            data_on_device="on",
            store_rate=0.2,
            **{"epochs": 2, "val": False, "dense_optimizer": "sgd", "dense_lr": 0.05, **kw},
            log_every=100,
            warmup_steps=1,
            cuda_graphs=graphs,
            device="cuda",
        )  # fmt: skip
    )
    tr = build_trainer(cfg, env, RunLog(active=False), distributed_embedding)
    assert isinstance(tr.run_step, MultiRankGraphedStep) == graphs, tr.graph_note
    if graphs:  # eager steps long enough that their own segment graphs are captured and replayed
        tr.run_step.warmup = 6
    cls, stats = type(tr.run_step), []
    call = cls.__call__

    def counted(self, *a, **k):  # (each step's [loss sum, correct]: a replay's output is reused)
        out = call(self, *a, **k)
        stats.append(out.clone())
        return out

    cls.__call__ = counted  # (on the class: the trainer's isinstance checks still hold)
    try:
        res = tr.fit()
    finally:
        cls.__call__ = call
    out_stats = torch.stack(stats).double().sum(0)
    sd = tr.model.embedding.state_dict()
    order = torch.argsort(sd["ids"])
    out = {"weight": sd["weight"][order], "opt": sd["opt_state"], "res": res, "stats": out_stats}
    out["dense"] = {k: v.clone() for k, v in tr.model.dense_state_dict().items()}
    out["replays"] = getattr(tr.run_step, "replays", 0)
    out["ahead_steps"] = getattr(tr.run_step, "replays_ahead", 0)
    out["planned"] = getattr(tr.run_step, "replays_planned", 0)
    if out["opt"].numel():
        out["opt"] = out["opt"][order]
    return out


def checked(body: Callable[[Any, Path], None], ok: str) -> int:
    """Under torchrun: the data set in ``sys.argv[1]`` (made by rank 0), ``body(env, root)``
    on every rank, then rank 0 prints ``ok``."""
    env = init_distributed(device="cuda")
    root = Path(sys.argv[1])
    if env.rank == 0:
        make_data(root)
    barrier(env)
    body(env, root)
    shutdown(env)
    if env.rank == 0:
        print(ok, flush=True)
    return 0


def assert_same_state(got: dict, want: dict) -> None:
    """Two :func:`run` results' rows, optimizer state and dense layers equal (GPU atomics add
    in any order: hot rows differ in the last bits)."""
    torch.testing.assert_close(got["weight"], want["weight"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got["opt"], want["opt"], rtol=1e-4, atol=1e-6)
    for k in want["dense"]:
        torch.testing.assert_close(got["dense"][k], want["dense"][k], rtol=1e-3, atol=1e-5)


def compare(env: Any, root: Path) -> None:
    """The captured step against the eager one, for each optimizer and bound (the strict
    order, its plans made one step ahead on a side stream by default; reading ahead is
    tests/gpu_read_ahead_check.py's)."""
    from hetgmp.embedding.padded import ahead as read_ahead

    read_ahead.ENABLED = False
    for opt, bound in (("adagrad", 0), ("adagrad", 100), ("sgd", 100)):
        kw = dict(optimizer=opt, bound=bound, lr=0.05 if opt == "adagrad" else 5.0)
        g = run(env, root, True, **kw)
        e = run(env, root, False, **kw)
        assert g["replays"] > 10, g["replays"]
        assert g["planned"] > 5, g["planned"]  # (plans made on the side stream, captured)
        assert_same_state(g, e)
        # the loss and accuracy sums (made beside the backward in a graph: step.METRICS_BESIDE)
        torch.testing.assert_close(g["stats"], e["stats"], rtol=1e-3, atol=2.0)
        cg, ce = g["res"]["embedding_counters"], e["res"]["embedding_counters"]
        for k in ("rows_owned", "rows_mirror_fresh", "rows_mirror_stale_ok", "rows_remote",
                  "pushes_sent"):  # fmt: skip
            assert cg[k] == ce[k], (opt, bound, k, cg[k], ce[k])
        print(
            f"rank {env.rank} {opt} bound {bound}: graph == eager ({g['replays']} replays, "
            f"{g['planned']} planned ahead)"
        )


if __name__ == "__main__":
    sys.exit(checked(compare, "WHOLE STEP CHECK OK"))
