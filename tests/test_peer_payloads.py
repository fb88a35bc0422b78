"""The padded exchange's payloads over peer memory (:mod:`hetgmp.embedding.padded.peer_payloads`)
on spawned gloo ranks (shared-memory files between the processes): the whole-step flow and the
eager padded path train exactly as with the all-to-alls (rows, state, dense layers, counters),
with the receive buffers in peer memory. (On 2 GPUs: variant ``peer`` of
``bench/gpu/read_ahead_ab.sh``, and ``tests/gpu_peer_memory_check.py``.)"""

from __future__ import annotations

import pytest
from test_whole_step_multi import _rank, _switched_runs_equal


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
    a2a, peer = _switched_runs_equal(
        tiny_dataset, tmp_path, _rank_peer, whole, optimizer=optimizer, bound=bound
    )
    assert a2a[0]["peer_exchanges"] == 0 and peer[0]["peer_exchanges"] >= 20  # (2 a step)
