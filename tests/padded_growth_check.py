"""The fused padded segments when capacities grow after the pre-sync segment has started,
under torchrun on 2 CPU ranks with Triton's interpreter (``TRITON_INTERPRET=1``; run by
``tests/test_padded_kernels.py``): hot ids first, then uniform ones, so the query
capacity grows mid-run and the new buffers adopt what the pre-sync segment wrote into the old
ones (the due-mirror counts among it: once they were not carried over and a step pushed no due
mirror, seen on 2 ranks of one H100). Every rank compares the padded exchange with the exact
one on the torch kernels (owned rows, pushes) and rank 0 prints ``GROWTH CHECK OK``. The test
runs :func:`check` on ranks spawned in its interpreted process (no torchrun of its own)."""

from __future__ import annotations

import numpy as np
import torch

from hetgmp.comm.launch import init_distributed, shutdown
from hetgmp.embedding import DistributedEmbedding
from hetgmp.partition.plan import Plan

# (a batch of 512 ids: the uniform steps' distinct rows pass the 256 of the first capacities,
# and 4 steps: the growth comes in a step whose pre-sync segment ran)
ROWS, DIM, FIELDS, BATCH, STEPS = 20_000, 4, 4, 128, 4


def train(env, exchange: str, kernels: str) -> tuple[dict, dict, DistributedEmbedding]:
    rng = np.random.default_rng(7)
    owner = rng.integers(0, env.world_size, ROWS).astype(np.int32)
    mirrors = [rng.permutation(np.flatnonzero(owner != w)) for w in range(env.world_size)]
    plan = Plan(np.zeros(env.world_size, np.int32), owner, mirrors, {})
    emb = DistributedEmbedding(
        ROWS, DIM, env, plan, store_rate=0.1, bound=0, optimizer="sgd", lr=0.05, seed=3,
        replies="all", exchange=exchange, kernels=kernels,
    )  # fmt: skip
    emb.peers_full(True)  # (every rank's batch full: the pre-sync path may run)
    rng = np.random.default_rng(100 + env.rank)
    for s in range(STEPS):
        if s < STEPS // 2:
            ids = np.minimum(rng.zipf(2.0, (BATCH, FIELDS)) - 1, ROWS - 1)
        else:  # (uniform: more distinct ids, more queries: query and row capacities grow)
            ids = rng.integers(0, ROWS, (BATCH, FIELDS))
        g = torch.from_numpy(rng.standard_normal((BATCH, FIELDS, DIM)).astype(np.float32))
        emb(torch.from_numpy(ids)).backward(g)
    return emb.state_dict(), emb.counters(), emb


def check(env) -> None:
    """The padded exchange on the fused kernels against the exact one on torch's."""
    sd_e, c_e, _ = train(env, "exact", "torch")
    sd_p, c_p, emb = train(env, "padded", "triton")
    assert len(emb.padded_rebuilds) >= 2 and emb.padded_presyncs > 0, emb.padded_rebuilds
    assert c_p["pushes_sent"] == c_e["pushes_sent"], (c_p["pushes_sent"], c_e["pushes_sent"])
    torch.testing.assert_close(sd_p["weight"], sd_e["weight"], rtol=1e-5, atol=1e-6)


def main() -> None:
    env = init_distributed(backend="gloo", device="cpu")
    check(env)
    shutdown(env)
    if env.rank == 0:
        print("GROWTH CHECK OK", flush=True)


if __name__ == "__main__":
    main()
