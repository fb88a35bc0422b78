"""Ranks with unequal batch counts and the padded exchange's pre-sync path (issue 30's trust
side): the path is this rank's decision from its own shapes, so a rank with a full batch beside
one with a partial or empty batch would take it alone and meet its peers in another collective
(on 2 H100s: a hang until NCCL's watchdog, ``tests/gpu_uneven_check.py``). The trainer tells
the engine each step whether every rank's batch is full (``StepEngine.peers_full``); the
stepper takes the path only then. Here on gloo ranks: every rank's steps are recorded."""

from __future__ import annotations

from test_train_dist import _cfg, _uneven_plan

from hetgmp.comm.spawn import spawn_ranks
from hetgmp.train.run import train


def _recorded(env, cfg) -> list[tuple[bool, bool]]:  # type: ignore[no-untyped-def]
    """``train(cfg)``, each training step's (every rank full, took the pre-sync path)."""
    from hetgmp.embedding.collective.stepper import Stepper

    seen: list[tuple[bool, bool]] = []
    step = Stepper.step

    def recorded(self, prep, *, op, error, training):  # type: ignore[no-untyped-def]
        before = self.padded.presyncs
        out = step(self, prep, op=op, error=error, training=training)
        if training:
            seen.append((self.peers_full, self.padded.presyncs > before))
        return out

    Stepper.step = recorded  # type: ignore[method-assign]
    try:
        train(cfg, env)
    finally:
        Stepper.step = step  # type: ignore[method-assign]
    return seen


def test_pre_sync_path_only_where_every_rank_has_a_full_batch(tiny_dataset, tmp_path) -> None:
    plan = _uneven_plan(tiny_dataset, 2, tmp_path / "part.npz")  # (rank 0 ~3/4 of the samples)
    cfg = _cfg(tiny_dataset.root, epochs=2, partition=plan, store_rate=1.0, bound=0,
               optimizer="sgd", replies="all", exchange="padded")  # fmt: skip
    for seen in spawn_ranks(_recorded, 2, cfg, timeout_s=180):
        assert any(not full for full, _ in seen), "every step full: the check proves nothing"
        assert any(took for _, took in seen), "the pre-sync path never ran"
        assert not any(took and not full for full, took in seen), seen
