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

    def counted(self, send, name, rider=None) -> None:  # type: ignore[no-untyped-def]
        calls["n"] += 1
        exchange(self, send, name, rider)

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


def _interpreted_peer(env, cfg, pull: bool = True) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """The whole-step flow with the fused Triton segments in Triton's interpreter, with the
    all-to-alls and with pack and answer writing straight into the peers' receive rows
    (``pull``: the replies read from the owners' send buffers, the default; else written into
    the queriers' rows)."""
    from test_whole_step_multi import interpreter_now

    interpreter_now()
    from hetgmp.embedding.padded import peer_payloads

    off = _rank_peer(env, cfg, True, False)
    direct = []
    init = peer_payloads.PeerPayloads.__init__

    def seen(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
        init(self, *a, **kw)
        direct.append(self.direct)

    peer_payloads.PeerPayloads.__init__ = seen  # type: ignore[method-assign]
    peer_payloads.PULL_REPLIES = pull
    on = _rank_peer(env, cfg, True, True)
    on["direct"] = direct
    return off, on


def _interpreted_pushed(env, cfg) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    return _interpreted_peer(env, cfg, pull=False)


def test_fused_segments_write_straight_into_the_peers_rows_in_interpreter(
    tiny_dataset, tmp_path
) -> None:
    """Pack and answer's kernels given the peers' row addresses (``.payload_triton``) train
    exactly as the all-to-alls: every entry lands in the peer's row it reads, and finish reads
    the replies from the owners' send buffers (``PULL_REPLIES``, the default)."""
    pytest.importorskip("triton")
    from test_whole_step_multi import _assert_runs_equal, interpreted_runs

    runs = interpreted_runs(tiny_dataset, tmp_path, _interpreted_peer, iter=6)
    _assert_runs_equal([r[0] for r in runs], [r[1] for r in runs])
    on = runs[0][1]
    assert on["direct"] and all(on["direct"]) and on["peer_exchanges"] >= 10  # (2 a step)
    assert on["res"]["exchange_payloads"].startswith("written by the exchange's kernels")
    assert "the replies read from the owners'" in on["res"]["exchange_payloads"]


# (slow: ~12 s in the interpreter for a form off by default since measured, PULL_REPLIES off)
@pytest.mark.slow
def test_fused_segments_with_replies_written_into_the_queriers_rows(tiny_dataset, tmp_path) -> None:
    """As above with the replies written by answer into the queriers' receive rows."""
    pytest.importorskip("triton")
    from test_whole_step_multi import _assert_runs_equal, interpreted_runs

    runs = interpreted_runs(tiny_dataset, tmp_path, _interpreted_pushed, iter=6)
    _assert_runs_equal([r[0] for r in runs], [r[1] for r in runs])
    on = runs[0][1]
    assert on["direct"] and all(on["direct"]) and on["peer_exchanges"] >= 10
    assert on["res"]["exchange_payloads"].startswith("written by the exchange's kernels")
    assert "the replies read" not in on["res"]["exchange_payloads"]
