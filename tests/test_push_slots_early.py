"""The pushes' ids and counts sent in the counts phase and mapped to the owner's slots there
(``padded.owner_update.PUSH_SLOTS_EARLY``: off until measured), and with it the own rows no
push joins updated right after the pre-sync kernel (``OWN_SPLIT``), and their staging launched
with that update apart from the rest of the pre-sync kernel (``STAGE_BESIDE``). On spawned gloo ranks with the
payloads in peer memory (shared-memory files) and the fused Triton segments in Triton's
interpreter, the whole-step flow trains exactly as without the switch (rows, state, dense
layers, counters), with the early launch run each step and pushes sent; row-wise Adagrad, so
own rows and pushes meet in one update per row, at a bound where mirrors push too."""

from __future__ import annotations

import pytest
import torch
from test_peer_payloads import _rank_peer
from test_whole_step_multi import _assert_runs_equal, interpreted_runs, interpreter_now


def _versions(tr) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The owned rows' versions by global id (the counts that pushes move)."""
    store = tr.model.embedding.whole_step().ctx.store
    ids, ver = store.stored_ids[: store.n_own], store.version_full[: store.n_own]
    return ver[torch.argsort(ids)].clone()


def _with_versions(env, cfg) -> dict:  # type: ignore[no-untyped-def]
    """:func:`_rank_peer`'s whole-step run on peer payloads, and its owned rows' versions."""
    import test_whole_step_multi

    built, build = [], test_whole_step_multi.build_trainer

    def keep(*a, **kw):  # type: ignore[no-untyped-def]
        built.append(build(*a, **kw))
        return built[-1]

    test_whole_step_multi.build_trainer = keep
    try:
        out = _rank_peer(env, cfg, True, True)
    finally:
        test_whole_step_multi.build_trainer = build
    out["versions"] = _versions(built[-1])
    return out


def _interpreted(env, cfg) -> tuple[dict, dict, dict]:  # type: ignore[no-untyped-def]
    interpreter_now()
    from hetgmp.embedding.padded import owner_update

    calls = {"early": 0}
    real = owner_update.pushes_early

    def counted(st) -> None:  # type: ignore[no-untyped-def]
        real(st)
        calls["early"] += int(st.pushes_early)

    owner_update.pushes_early = counted  # type: ignore[assignment]
    off = _with_versions(env, cfg)
    owner_update.PUSH_SLOTS_EARLY = True
    on = _with_versions(env, cfg)
    on["early_calls"] = calls["early"]
    split_calls, update = [0], owner_update.own_update_early

    def split(st, stage=None) -> None:  # type: ignore[no-untyped-def]
        split_calls[0] += int(st.own_split)
        update(st, stage)

    owner_update.own_update_early = split  # type: ignore[assignment]
    owner_update.OWN_SPLIT = True
    forms = _segment_forms()
    split_run = _with_versions(env, cfg)
    split_run["split_calls"] = split_calls[0]
    split_run["forms"] = forms
    staged_calls, stages = [0], owner_update.stages_beside

    def staging(st) -> bool:  # type: ignore[no-untyped-def]
        beside = stages(st)
        staged_calls[0] += int(beside)
        return beside

    owner_update.stages_beside = staging  # type: ignore[assignment]
    owner_update.STAGE_BESIDE = True
    staged = _with_versions(env, cfg)
    split_run["staged"] = staged
    staged["staged_calls"] = staged_calls[0]
    return off, on, split_run


def _segment_forms() -> dict:
    """Each graph segment's key -> the owner-update forms it ran under (pushes early, own
    split) outside a whole-step capture: a CUDA run captures a segment's
    graph per key and replays it whatever the host then decides, so one key must mean one
    form (a key without the split once replayed the own rows' early update at a step without
    it: 13 % of the rows off on 2 H100s)."""
    from hetgmp.embedding.padded.buffers import StaticExchange

    forms: dict = {}
    real = StaticExchange._segment

    def seen(self, key, fn, *, capturable=True) -> None:  # type: ignore[no-untyped-def]
        if not self._graphs.plain and capturable:
            # (own_early: decided inside the counts segment from the configuration alone)
            forms.setdefault(repr(key), set()).add((self.pushes_early, self.own_split))
        real(self, key, fn, capturable=capturable)

    StaticExchange._segment = seen  # type: ignore[method-assign]
    return forms


# (slow: ~75 s in Triton's interpreter for two switches off until measured; five epochs, so
# that eager steps of either form meet the same ring slots; run with pytest -m slow before
# turning one on)
@pytest.mark.slow
def test_pushes_mapped_in_the_counts_phase_train_as_on_the_chain(tiny_dataset, tmp_path) -> None:
    pytest.importorskip("triton")
    runs = interpreted_runs(tiny_dataset, tmp_path, _interpreted, iter=40)
    _assert_runs_equal([r[0] for r in runs], [r[1] for r in runs])
    _assert_runs_equal([r[0] for r in runs], [r[2] for r in runs])  # (OWN_SPLIT too)
    # (and STAGE_BESIDE: the pre-sync kernel's own-row staging launched apart from the rest)
    _assert_runs_equal([r[0] for r in runs], [r[2]["staged"] for r in runs])
    for off, on, split in runs:  # (and the versions: the pushes' counts move them)
        assert torch.equal(off["versions"], on["versions"])
        assert torch.equal(off["versions"], split["versions"])
        assert split["split_calls"] >= 4, split["split_calls"]  # (the own rows' early update)
        assert split["staged"]["staged_calls"] >= 4, split["staged"]["staged_calls"]
        assert torch.equal(off["versions"], split["staged"]["versions"])
        mixed = {k: v for k, v in split["forms"].items() if len(v) > 1}
        assert split["forms"] and not mixed, mixed  # (a segment's graph: one form per key)
        assert on["early_calls"] >= 4, on["early_calls"]  # (the ids went early each step)
        assert on["res"]["embedding_counters"]["pushes_sent"] > 0  # (not vacuous)
        assert on["res"]["exchange_payloads"].startswith("written by the exchange's kernels")
