"""Process-group teardown: ``shutdown`` really frees the gloo group, so no gloo worker thread
is left running into interpreter exit (where one can abort the rank: exit 134, "terminate called
without an active exception", stack ``ProcessGroupGloo::runLoop`` -> ``decref_pyobject``)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from hetgmp.comm import collectives
from hetgmp.comm.env import DistEnv
from hetgmp.comm.launch import shutdown
from hetgmp.comm.spawn import spawn_ranks


def _thread_names() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return names


def optimizer_after_init_then_shutdown(env: DistEnv) -> dict:
    """What every training run does: build a torch optimizer once the group exists (torch.optim
    imports torch._dynamo, which imports torch.distributed.nn.functional & co., which bind the
    live WORLD group into default arguments), run collectives, shut down."""
    pre_imported = "torch.distributed.nn.functional" in sys.modules
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([p], lr=0.1)
    p.grad = collectives.all_reduce_sum(env, torch.ones(3))
    opt.step()
    import torch.distributed.nn.functional as dnf

    captured = any(d is env.group for d in (dnf.broadcast.__defaults__ or ()))
    gloo_before = sum(n.startswith("pt_gloo") for n in _thread_names())
    shutdown(env, wait_for_peers=True)
    return {
        "pre_imported": pre_imported,
        "captured": captured,
        "gloo_before": gloo_before,
        "gloo_after": sorted(n for n in _thread_names() if n.startswith(("pt_gloo", "gloo"))),
        "p": p.detach().tolist(),
    }


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc thread names")
def test_shutdown_joins_gloo_threads_even_when_torch_holds_the_group() -> None:
    # (fresh interpreters: forked ranks have torch._dynamo imported by the forkserver,
    # hetgmp.comm.spawn.PRELOAD, so no module would bind the group)
    res = spawn_ranks(optimizer_after_init_then_shutdown, 2, timeout_s=120, start_method="spawn")
    for r in res:
        assert not r["pre_imported"], "torch.distributed.nn imported before the group: vacuous"
        # What provoked the abort (torch 2.13): a torch module imported after the group was
        # created holds it, r["captured"]. Whatever torch does, no gloo thread may outlive it.
        assert r["gloo_before"] > 0, "no gloo worker threads seen while the group was alive"
        assert r["gloo_after"] == [], f"gloo threads outlive shutdown(): {r['gloo_after']}"
    assert res[0]["p"] == res[1]["p"]


def closers_run_before_the_group_goes(env: DistEnv) -> list[str]:
    seen: list[str] = []
    env.closers.append(lambda: seen.append(f"first, group alive: {env.group is not None}"))
    env.closers.append(lambda: seen.append(f"second, group alive: {env.group is not None}"))
    shutdown(env)
    seen.append(f"after: group alive: {env.group is not None}, closers left: {len(env.closers)}")
    return seen


def test_shutdown_runs_the_closers_first_newest_first() -> None:
    # (CUDA graphs holding captured NCCL collectives must be dropped before the communicator:
    # DistributedEmbedding registers such a closer for its padded exchange)
    got = spawn_ranks(closers_run_before_the_group_goes, 2, timeout_s=120)
    for seen in got:
        assert seen == [
            "second, group alive: True",
            "first, group alive: True",
            "after: group alive: False, closers left: 0",
        ], seen


def test_graph_releasers_of_dropped_tables_do_not_pile_up() -> None:
    import gc

    from hetgmp.embedding.padded.releaser import GraphReleaser as _GraphReleaser

    class Table:  # stands in for a DistributedEmbedding: release_graphs() is all it needs
        released = 0

        def release_graphs(self) -> None:
            Table.released += 1

    env = DistEnv()
    other = []
    env.closers.append(lambda: other.append("ran"))  # not a releaser: always kept
    kept = Table()
    _GraphReleaser.register(env, Table())  # dropped at once
    gc.collect()
    _GraphReleaser.register(env, kept)
    _GraphReleaser.register(env, Table())  # dropped at once
    gc.collect()
    _GraphReleaser.register(env, kept)  # (a second table would prune the dead one)
    assert len(env.closers) == 3  # the lambda, and two for kept (the dead ones pruned)
    shutdown(env)  # runs them all
    assert Table.released == 2 and other == ["ran"] and env.closers == []
