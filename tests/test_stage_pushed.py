"""Only the own rows a push joins staged by the pre-sync kernel, the others' early update
reading their gradient where the rows' sum left it (``padded.owner_update.STAGE_PUSHED_ONLY``:
off until measured). On spawned gloo ranks with the payloads in peer memory and the fused
Triton segments in Triton's interpreter, the whole-step flow trains exactly as with every own
row staged (rows, state, versions, dense layers, counters), the switch in effect at every step
that splits the update, and some own rows joined by pushes (else nothing would be staged)."""

from __future__ import annotations

import pytest
import torch
from test_push_slots_early import _with_versions
from test_whole_step_multi import _assert_runs_equal, interpreted_runs, interpreter_now


def _interpreted(env, cfg) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    interpreter_now()
    from hetgmp.embedding.padded import owner_update

    assert owner_update.OWN_SPLIT and owner_update.PUSH_SLOTS_EARLY  # (the defaults it needs)
    staged = _with_versions(env, cfg)
    seen = {"pushed_only": 0, "joined": 0}
    real_rule, real_update = owner_update.stages_pushed_only, owner_update.own_update_early

    def rule(st) -> bool:  # type: ignore[no-untyped-def]
        on = real_rule(st)
        seen["pushed_only"] += int(on)
        return on

    def update(st, stage=None) -> None:  # type: ignore[no-untyped-def]
        if st.own_split:  # (own rows a push joins: staged, so the switch had work to skip)
            seen["joined"] += int(st.own_entries[4][: st.cap.o].ne(0).sum())
        real_update(st, stage)

    owner_update.stages_pushed_only = rule  # type: ignore[assignment]
    owner_update.own_update_early = update  # type: ignore[assignment]
    owner_update.STAGE_PUSHED_ONLY = True
    try:
        pushed_only = _with_versions(env, cfg)
    finally:
        owner_update.STAGE_PUSHED_ONLY = False
    pushed_only.update(seen)
    return staged, pushed_only


# (slow: two interpreted runs, ~40 s; run with pytest -m slow before turning the switch on)
@pytest.mark.slow
def test_staging_only_the_pushed_own_rows_trains_as_staging_all(tiny_dataset, tmp_path) -> None:
    pytest.importorskip("triton")
    runs = interpreted_runs(tiny_dataset, tmp_path, _interpreted, iter=40)
    _assert_runs_equal([r[0] for r in runs], [r[1] for r in runs])
    for staged, pushed_only in runs:
        assert torch.equal(staged["versions"], pushed_only["versions"])
        # (each split update's pre-sync kernel and its own update: at least 4 steps)
        assert pushed_only["pushed_only"] >= 8, pushed_only["pushed_only"]
        assert pushed_only["joined"] > 0  # (own rows joined by pushes: not vacuous)
        assert pushed_only["res"]["embedding_counters"]["pushes_sent"] > 0
