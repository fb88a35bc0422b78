"""The fused Triton kernels of the padded exchange (hetgmp/embedding/padded/kernels.py) against
their reference, the torch op sequences of the same segments (hetgmp/embedding/padded/reference.py).

Both run on gloo CPU ranks; the Triton kernels in Triton's interpreter (``TRITON_INTERPRET=1``,
which must be set before triton is imported: a subprocess). Every step's looked-up values, the
state tensors before the final flush (weights, versions, pending counts, accumulators), the rows
after the flush and the counters must match. The GPU run of the same comparison is
tests/gpu_padded_check.py (``-m gpu``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import json
    import sys
    import numpy as np
    import torch

    def run(env, kernels, bound, steps, world, optimizer, owner_fused=False, push_cap=0):
        from hetgmp.embedding import DistributedEmbedding
        from hetgmp.embedding.padded import owner_update as fused_kernels
        from hetgmp.embedding.padded import buffers as static

        fused_kernels.FUSED_OWNER_UPDATE = owner_fused  # (the owner's update from row kernels)
        if kernels == "triton":
            poison_padding()

        assert static.FUSED_WITH_STATE  # (the fused Adagrad segments: on by default)
        from hetgmp.partition.plan import Plan

        rng = np.random.default_rng(world)
        rows = 80
        owner = rng.integers(0, world, rows).astype(np.int32)
        mirrors = [np.flatnonzero(owner != w).astype(np.int64) for w in range(world)]
        plan = Plan(np.zeros(world, np.int32), owner, mirrors, {})
        emb = DistributedEmbedding(
            rows, 6, env, plan, store_rate=1.0 if push_cap else 0.25, bound=bound,
            optimizer=optimizer, lr=0.1, kernels=kernels, replies="all", exchange="padded",
        )
        emb.peers_full(True)  # (every rank's batch full: the pre-sync path may run)
        if push_cap:  # capacities fixed in advance, pushes under the queries: some wait
            from hetgmp.embedding.padded.buffers import Capacity

            o = 48 if optimizer != "sgd" else 0
            emb._padded.frozen = Capacity(q=48, p=push_cap, u=48, n=48, o=o)
        g = torch.Generator().manual_seed(env.rank)
        outs = []
        for s in range(steps):
            b = 12 if s % 5 == 4 else 16  # a shape change: buffers rebuilt, pre-sync skipped
            ids = (torch.rand(b, 3, generator=g) ** 3 * rows).long()
            emb.prefetch(ids)
            out = emb(ids)
            outs.append(out.detach().clone())
            (out.pow(2).sum() * 0.5).backward()
        state = [t.clone() for t in (emb.weight, emb.version, emb.pending, emb.grad_acc,
                                     emb.delta_acc, emb.opt_state)]
        counters = emb.counters()
        assert not push_cap or counters["pushes_capacity_deferred"] > 0, counters
        assert kernels != "triton" or sum(POISONED) > 0, POISONED  # (padding there to poison)
        return emb.state_dict(), outs, state, counters, emb.padded_presyncs

    POISONED = []  # (padding entries poisoned, per plan)

    def poison_padding():
        # the plan's padding (u / cnt / slot past the distinct rows) is unspecified (the fused
        # plan leaves it as it was): in the fused run it holds junk that no reader may take,
        # so an unmasked read would show as an index error or a difference from the reference
        from hetgmp.embedding import batch

        prepare = batch.BatchPlanner.prepare
        if getattr(prepare, "poisons", False):
            return

        def poisoned(self, ids, out=None):
            p = prepare(self, ids, out)
            k = int(p.blocks.sum())
            p.u[k:], p.cnt[k:], p.slot[k:] = 987654321987, 55555, 2**40 + 7
            POISONED.append(p.u.numel() - k)
            return p

        poisoned.poisons = True
        batch.BatchPlanner.prepare = poisoned

    def run_all(env, world, configs):
        # every configuration and both kernel sets in one spawn of the ranks (a spawn cost
        # more than the steps); torch first (the triton runs poison the plan's padding)
        return {k: [run(env, k, c[0], c[1], world, *c[2:]) for c in configs]
                for k in ("torch", "triton")}

    def check(world, configs):
        from hetgmp.comm.spawn import spawn_ranks

        got = spawn_ranks(run_all, world, world, configs, timeout_s=600)
        for rank, r in enumerate(got):
            refs, fuseds = r["torch"], r["triton"]
            for config, ref, fused in zip(configs, refs, fuseds):
                what = (rank, config)
                assert torch.equal(ref[0]["ids"], fused[0]["ids"]), what
                torch.testing.assert_close(fused[0]["weight"], ref[0]["weight"], rtol=1e-5,
                                           atol=1e-6, msg=lambda m: f"{what}: {m}")
                for a, b in zip(ref[1], fused[1]):
                    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6,
                                               msg=lambda m: f"{what}: {m}")
                for a, b in zip(ref[2], fused[2]):
                    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6,
                                               msg=lambda m: f"{what}: {m}")
                assert ref[3] == fused[3], (what, ref[3], fused[3])
                # the pre-sync segment ran (fused and reference)
                assert ref[4] == fused[4] > 0, (what, ref[4], fused[4])
        print("ok")

    def check_growth():
        # tests/padded_growth_check.py on 2 ranks of this process's forkserver (its own
        # torchrun cost more than its steps)
        import padded_growth_check
        from hetgmp.comm.spawn import spawn_ranks

        spawn_ranks(padded_growth_check.check, 2, timeout_s=300)
        print("GROWTH CHECK OK")

    if __name__ == "__main__":
        for world, configs in json.loads(sys.argv[1]):  # (one process for every world size)
            check(world, configs)
        check_growth()
    """
)


# (bound, steps, optimizer, owner_fused, push_cap) by world size: each world's configurations
# run in one spawn of its ranks, both kernel sets. 6 steps: the shape change at step 4 and
# back at 5, pre-syncs between them; world 3's Adagrad with the owner's update fused only
# (the unfused one: world 2's)
CONFIGS = {
    2: [(0, 6, "sgd", 0, 0), (0, 6, "adagrad", 0, 0), (1, 6, "sgd", 0, 4),
        (1, 6, "adagrad", 1, 4)],
    3: [(3, 6, "sgd", 0, 0), (3, 6, "adagrad", 1, 0)],
}  # fmt: skip


@pytest.mark.timeout(240)  # (three interpreted runs in one test: ~20-30 s alone, more under load)
def test_fused_padded_segments_match_reference(tmp_path) -> None:
    """The fused segments against the torch ones, for each configuration (``owner_fused``: the
    owner's merged Adagrad update from the row kernels too, padded.FUSED_OWNER_UPDATE;
    ``push_cap``: fixed capacities whose push payload has room for that many rows a peer, so
    due mirrors wait); then, when capacities grow after the pre-sync segment began,
    tests/padded_growth_check.py on 2 ranks (the same process: one start of the interpreter)."""
    script = tmp_path / "fused_check.py"  # a file: spawned ranks re-import it
    script.write_text(SCRIPT)
    paths = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=paths)
    p = subprocess.run(
        [sys.executable, str(script), json.dumps(sorted(CONFIGS.items()))],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    want = ["ok"] * len(CONFIGS) + ["GROWTH", "CHECK", "OK"]
    assert p.returncode == 0 and p.stdout.split() == want, p.stdout + p.stderr
