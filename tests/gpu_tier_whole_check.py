"""The multi-rank whole-step CUDA graph with each rank's owned rows on the host tier (issue 33:
``--rows-on host --exchange padded``, each epoch's rows held resident at its epoch start,
``hetgmp.embedding.tier_epoch``) against the same graph with every row on the device.

Run by ``tests/test_tier_epoch.py`` (GPU, 2 GPUs) as ``python -m torch.distributed.run
--standalone --nproc_per_node 2 tests/gpu_tier_whole_check.py DIR``: both train
``gpu_whole_step_check``'s generated set on NCCL (Adagrad at bound 0, SGD at bound 100), a 60 %
cache started cold; every rank compares its owned rows, optimizer state and dense layers (to
the tolerance GPU atomics leave), and that the cache missed; rank 0 prints
``TIER WHOLE STEP CHECK OK``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from gpu_whole_step_check import checked, run


def compare(env: Any, root: Path) -> None:
    """The tiered graph against the all-on-device graph, for each optimizer and bound."""
    from hetgmp.embedding.padded import ahead as read_ahead

    read_ahead.ENABLED = False
    for opt, bound in (("adagrad", 0), ("sgd", 100)):
        kw = dict(optimizer=opt, bound=bound, lr=0.05 if opt == "adagrad" else 5.0,
                  exchange="padded")  # fmt: skip
        t = run(env, root, True, rows_on="host", cache_budget=0.6, cache_warm="cold", **kw)
        d = run(env, root, True, **kw)
        assert t["replays"] > 10, t["replays"]
        tier = t["res"]["host_tier"]
        assert tier["misses"] > 0, tier  # (started cold: the epoch holds moved rows in)
        torch.testing.assert_close(t["weight"], d["weight"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(t["opt"], d["opt"], rtol=1e-4, atol=1e-6)
        for k in d["dense"]:
            torch.testing.assert_close(t["dense"][k], d["dense"][k], rtol=1e-3, atol=1e-5)
        print(
            f"rank {env.rank} {opt} bound {bound}: tiered graph == device graph "
            f"({t['replays']} replays, {tier['misses']:.0f} misses)"
        )


def windows(env: Any, root: Path) -> None:
    """An epoch too big for the cache (:mod:`hetgmp.embedding.tier_windows`): the smallest
    budget that trains, tried upwards (below one step's rows every rank stops alike), must
    have cut windows, and train as all on the device (Adagrad, bound 0)."""
    from hetgmp.embedding import tier_windows
    from hetgmp.embedding.tier_host import CacheBudgetError

    made: list[Any] = []
    real = tier_windows.EpochWindows.__init__

    def init(self: Any, *a: Any) -> None:
        real(self, *a)
        made.append(self)

    tier_windows.EpochWindows.__init__ = init  # type: ignore[method-assign]
    kw = dict(optimizer="adagrad", bound=0, lr=0.05, exchange="padded")
    d = run(env, root, True, **kw)
    for budget in (0.05, 0.1, 0.2, 0.3):
        try:
            t = run(env, root, True, rows_on="host", cache_budget=budget, cache_warm="cold", **kw)
        except CacheBudgetError:
            continue
        if made[-1].halvings == 0:
            break  # (the epoch fit at once: no window was needed at this budget)
        torch.testing.assert_close(t["weight"], d["weight"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(t["opt"], d["opt"], rtol=1e-4, atol=1e-6)
        w = made[-1]
        print(f"rank {env.rank} windows at a {budget:.0%} cache: {w.length} steps each, "
              f"{w.holds} holds, {t['replays']} replays; tiered graph == device graph")  # fmt: skip
        return
    raise AssertionError("no budget needed windows and trained: the windows were not tried")


def both(env: Any, root: Path) -> None:
    compare(env, root)
    windows(env, root)


if __name__ == "__main__":
    sys.exit(checked(both, "TIER WHOLE STEP CHECK OK"))
