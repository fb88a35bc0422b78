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

    peer_payloads.PEER_PAYLOADS = peer_payloads.ON_CPU = peer  # (in the spawned ranks)
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
    if whole:  # (the results say how the payloads travelled)
        assert a2a[0]["res"]["exchange_payloads"] == "all-to-alls"
        assert peer[0]["res"]["exchange_payloads"].startswith("copied into the peers' memory")


def _interpreted_peer(env, cfg) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """The whole-step flow with the fused Triton segments in Triton's interpreter, with the
    all-to-alls and with pack and answer writing straight into the peers' receive rows."""
    from test_whole_step_multi import interpreter_now

    interpreter_now()
    from hetgmp.embedding.padded import peer_payloads

    direct = []
    init = peer_payloads.PeerPayloads.__init__

    def seen(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
        init(self, *a, **kw)
        direct.append(self.direct)

    peer_payloads.PeerPayloads.__init__ = seen  # type: ignore[method-assign]
    peer_payloads.PULL_REPLIES = False  # (the replies written into the queriers' rows)
    off, on = _rank_peer(env, cfg, True, False), _rank_peer(env, cfg, True, True)
    on["direct"] = direct
    peer_payloads.PULL_REPLIES = True  # (the replies read from the owners' send buffers)
    pulled = _rank_peer(env, cfg, True, True)
    return off, on, pulled


def test_fused_segments_write_straight_into_the_peers_rows_in_interpreter(
    tiny_dataset, tmp_path
) -> None:
    """Pack and answer's kernels given the peers' row addresses (``.payload_triton``) train
    exactly as the all-to-alls: every entry lands in the peer's row it reads; so do the
    replies pulled by finish from the owners' send buffers (``PULL_REPLIES``)."""
    pytest.importorskip("triton")
    from test_whole_step_multi import _assert_runs_equal, interpreted_runs

    runs = interpreted_runs(tiny_dataset, tmp_path, _interpreted_peer, iter=6)
    _assert_runs_equal([r[0] for r in runs], [r[1] for r in runs])
    _assert_runs_equal([r[0] for r in runs], [r[2] for r in runs])
    assert "the replies read from the owners'" in runs[0][2]["res"]["exchange_payloads"]
    on = runs[0][1]
    assert on["direct"] and all(on["direct"]) and on["peer_exchanges"] >= 10  # (2 a step)
    assert on["res"]["exchange_payloads"].startswith("written by the exchange's kernels")
    assert "the replies read" not in on["res"]["exchange_payloads"]
