"""The merged owner update's switches (on since measured): its own rows' entries written in the
counts phase (``padded.owner_update.OWN_SLOTS_EARLY``) and the versions moved by its Adagrad launch
(``VERSIONS_IN_UPDATE``). On spawned gloo ranks with the fused Triton segments in Triton's
interpreter, the whole-step flow and the eager padded path (whose inputs the host stages at
times, and then the update writes every entry) train exactly as with both off (rows, state,
dense layers, counters); row-wise Adagrad, so own rows and pushes meet in one update per row."""

from __future__ import annotations

import pytest
from test_whole_step_multi import _assert_runs_equal, _rank, interpreted_runs, interpreter_now


def _interpreted(env, cfg) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """Both runs in one fresh interpreter (``start_method="spawn"``: TRITON_INTERPRET is read
    at triton's first import)."""
    interpreter_now()
    from hetgmp.embedding.padded import owner_update

    calls = {"early": 0}
    real = owner_update.own_entries_early

    def counted(st) -> None:  # type: ignore[no-untyped-def]
        calls["early"] += int(owner_update._own_early(st))
        real(st)

    owner_update.own_entries_early = counted  # type: ignore[assignment]
    owner_update.OWN_SLOTS_EARLY = owner_update.VERSIONS_IN_UPDATE = False
    late = _rank(env, cfg, False, None)  # (the eager padded path: equal to the whole-step flow)
    owner_update.OWN_SLOTS_EARLY = owner_update.VERSIONS_IN_UPDATE = True
    early = _rank(env, cfg, True, None)
    early["early_calls"] = calls["early"]
    eager = _rank(env, cfg, False, None)  # (its inputs staged by the host at times: load())
    return late, early, eager


# (slow: 27 s in Triton's interpreter; the other whole-step tests run the switches on, their
# default since bench/results/gpu/tail_beside/; this one checks them against the path without)
@pytest.mark.slow
def test_owner_update_switches_train_exactly_as_without_them(tiny_dataset, tmp_path) -> None:
    pytest.importorskip("triton")
    runs = interpreted_runs(tiny_dataset, tmp_path, _interpreted)
    _assert_runs_equal([r[0] for r in runs], [r[1] for r in runs])
    _assert_runs_equal([r[0] for r in runs], [r[2] for r in runs])
    assert all(r[1]["early_calls"] >= 5 for r in runs)  # (the early launch ran each step)
    assert all(r[1]["res"]["embedding_counters"]["pushes_sent"] > 0 for r in runs)
