"""The padded exchange's payloads over peer memory (:mod:`hetgmp.embedding.padded.peer_payloads`)
on spawned gloo ranks (shared-memory files between the processes): the whole-step flow and the
eager padded path train exactly as with the all-to-alls (rows, state, dense layers, counters),
with the receive buffers in peer memory. (On 2 GPUs: variant ``peer`` of
``bench/gpu/read_ahead_ab.sh``, and ``tests/gpu_peer_memory_check.py``.)"""

from __future__ import annotations

import pytest
from test_whole_step_multi import _assert_runs_equal, _by_id, _cfg, _plan, _rank

from hetgmp.comm.spawn import spawn_ranks


def _rank_peer(env, cfg, whole: bool, peer: bool) -> dict:  # type: ignore[no-untyped-def]
    from hetgmp.embedding.padded import peer_payloads

    peer_payloads.PEER_PAYLOADS = peer  # (in the spawned ranks)
    calls = {"n": 0}
    exchange = peer_payloads.PeerPayloads.exchange

    def counted(self, send, name) -> None:  # type: ignore[no-untyped-def]
        calls["n"] += 1
        exchange(self, send, name)

    peer_payloads.PeerPayloads.exchange = counted  # type: ignore[method-assign]
    out = _rank(env, cfg, whole, None)
    out["peer_exchanges"] = calls["n"]
    return out


@pytest.mark.parametrize(("whole", "optimizer", "bound"), [(True, "adagrad", 3), (False, "sgd", 0)])
def test_payloads_over_peer_memory_train_as_over_all_to_alls(
    tiny_dataset, tmp_path, whole: bool, optimizer: str, bound: int
) -> None:
    plan = _plan(tiny_dataset, 2, tmp_path / "part.npz")
    cfg = _cfg(tiny_dataset.root, plan, optimizer=optimizer, bound=bound)
    a2a = spawn_ranks(_rank_peer, 2, cfg, whole, False, timeout_s=180)
    peer = spawn_ranks(_rank_peer, 2, cfg, whole, True, timeout_s=180)
    _assert_runs_equal(a2a, peer)
    assert a2a[0]["peer_exchanges"] == 0 and peer[0]["peer_exchanges"] >= 20  # (2 a step)
    ww = _by_id(peer[0])[0]
    assert (ww - ww.mean()).abs().max() > 0  # (the rows moved: not vacuous)
