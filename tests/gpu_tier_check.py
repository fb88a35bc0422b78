"""The host tier (``--rows-on host``, issue 33) on one CUDA GPU against all rows on the device.

Run by ``tests/test_tier_ranks_train.py``'s GPU test as ``python tests/gpu_tier_check.py DIR``
(one process, one GPU): the data set of ``gpu_whole_step_check.py`` trained at bound 0 three
times -- all on the device with CUDA graphs (the default, for speed), all on the device eagerly
(``--no-cuda-graphs``, the arithmetic the tier runs) and with the rows in pinned host memory
and a device cache of 10 % of them (``--cache-budget 0.1``; the batch after the current one
made resident on a copy stream). The tier's rows, optimizer state and dense layers must equal
the eager run's (bit for bit where the kernels' atomics add in the same order; within 1e-6
otherwise), its cache must have missed and written back, and it prints the samples/s of each
run; then ``TIER CHECK OK``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from hetgmp.config import validate
from hetgmp.train.config import TrainConfig
from hetgmp.train.run import build_trainer, distributed_embedding
from hetgmp.train.runlog import RunLog

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_whole_step_check import checked  # noqa: E402


def run(env: Any, root: Path, **kw: Any) -> dict[str, Any]:
    """One training run; its results, rows (by id), optimizer state and dense layers."""
    cfg = validate(
        TrainConfig(
            dataset=str(root),
            batch_size=256,
            embed_dim=16,
            progress=False,
            epochs=2,
            val=False,
            log_every=100,
            warmup_steps=5,
            bound=0,
            optimizer="adagrad",
            dense_optimizer="sgd",
            dense_lr=0.05,
            device="cuda",
            **kw,
        )  # fmt: skip
    )
    tr = build_trainer(cfg, env, RunLog(active=False), distributed_embedding)
    res = tr.fit()
    sd = tr.model.embedding.state_dict()
    order = torch.argsort(sd["ids"])
    dense = {k: v.detach().cpu().clone() for k, v in tr.model.dense_state_dict().items()}
    return {"res": res, "weight": sd["weight"][order], "opt": sd["opt_state"][order],
            "dense": dense}  # fmt: skip


def compare(env: Any, root: Path) -> None:
    """The tiered run against the eager all-on-device one (see the module docstring)."""
    graphs = run(env, root)
    eager = run(env, root, cuda_graphs=False)
    tier = run(env, root, cuda_graphs=False, rows_on="host", cache_budget=0.1)
    t = tier["res"]["host_tier"]
    assert t["misses"] > 0 and t["written_back"] > 0 and t["ahead"] > 0, t
    exact = torch.equal(tier["weight"], eager["weight"]) and torch.equal(tier["opt"], eager["opt"])
    torch.testing.assert_close(tier["weight"], eager["weight"], rtol=0, atol=1e-6)
    torch.testing.assert_close(tier["opt"], eager["opt"], rtol=1e-6, atol=1e-6)
    for k in eager["dense"]:
        torch.testing.assert_close(tier["dense"][k], eager["dense"][k], rtol=1e-5, atol=1e-6)
    print(f"rows equal to the eager run: {'bit for bit' if exact else 'within 1e-6'}")
    for name, r in (
        ("device, CUDA graphs", graphs),
        ("device, eager", eager),
        ("host tier 10 %", tier),
    ):
        print(f"{name}: {r['res']['speed']:,.0f} samples/s")
    print(f"host tier: hit rate {t['hit_rate']:.3f}, {t['bytes_h2d_per_step']:,.0f} B/step "
          f"host->device, {t['ahead']:.0f} of {t['steps']:.0f} batches made resident ahead")  # fmt: skip


if __name__ == "__main__":
    sys.exit(checked(compare, "TIER CHECK OK"))
