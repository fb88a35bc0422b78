"""``AsyncStep.meet``: the ranks' meeting through their async services (no process-group
collective), which precedes every process-group collective after point-to-point traffic."""

from __future__ import annotations

import time

import pytest
import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.errors import CommError
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.embedding import DistributedEmbedding
from hetgmp.embedding.rowservice import AsyncConfig

pytest.importorskip("zmq")


def _table(env: DistEnv, timeout_s: float = 30.0) -> DistributedEmbedding:
    cfg = AsyncConfig(max_lag=-1, host="127.0.0.1", timeout_s=timeout_s)
    return DistributedEmbedding(40, 4, env, sync="async", async_config=cfg)


def _late_arrivals(env: DistEnv) -> list[float]:
    """Rank r arrives at each of two meetings r x 0.4 s late; when did each meeting end?"""
    emb = _table(env)
    t0, ends = time.monotonic(), []
    for _ in range(2):
        time.sleep(0.4 * env.rank)
        emb.async_engine.meet("test meeting")
        ends.append(time.monotonic() - t0)
    emb.close()
    return ends


def test_meet_waits_for_every_rank() -> None:
    out = spawn_ranks(_late_arrivals, 3, timeout_s=120)
    for ends in out:  # (the last rank arrives at 0.8 s, then at 0.8 s after its first)
        assert ends[0] >= 0.75 and ends[1] >= 1.55
    assert max(e[1] for e in out) - min(e[1] for e in out) < 0.5  # (all leave together)


def _one_leaves(env: DistEnv, how: str) -> dict:
    emb = _table(env, timeout_s=2.0)
    out: dict = {"error": None}
    t0 = time.monotonic()
    if env.rank == 1 and how == "close":
        emb.close()  # (leaves instead of meeting)
        return out
    if env.rank == 1:
        time.sleep(4.0)  # (arrives after the others' timeout)
    try:
        emb.async_engine.meet("test meeting")
    except CommError as err:
        out["error"] = str(err)
    out["seconds"] = time.monotonic() - t0
    emb.close()
    return out


@pytest.mark.parametrize("how", ["close", "late"])
def test_meet_fails_clearly_without_a_peer(how: str) -> None:
    """A peer that closed its table fails the meeting at once, one that does not come within
    the timeout fails it then; either way the error names it."""
    r0 = spawn_ranks(_one_leaves, 2, how, timeout_s=120)[0]
    assert r0["error"] is not None and "test meeting" in r0["error"] and "rank 1" in r0["error"]
    if how == "close":
        assert "closed its table" in r0["error"] and r0["seconds"] < 2.0
    else:
        assert "waited 2s for rank 1" in r0["error"]


def _clock_around_a_meeting(env: DistEnv) -> list[int]:
    emb = _table(env)
    emb(torch.tensor([[1, 2]])).sum().backward()
    before = emb.async_engine.service.clocks[env.rank]
    emb.async_engine.meet("test meeting")
    after = emb.async_engine.service.clocks[env.rank]
    emb.flush()
    emb.close()
    return [before, after]


def test_meetings_do_not_move_the_clock() -> None:
    """A meeting republishes the rank's clock unchanged (the per-clock bound is untouched)."""
    for before, after in spawn_ranks(_clock_around_a_meeting, 2, timeout_s=120):
        assert before == after > 0
