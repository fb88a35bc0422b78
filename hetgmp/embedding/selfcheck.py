"""``python -m hetgmp.embedding.selfcheck``: launch check of the embedding runtime.

Run it under ``mpirun -np N``, ``torchrun`` or alone: it sets the process group up with
:func:`hetgmp.comm.launch.init_distributed`, trains a small table for a few bound-0 steps, gathers
the rows and compares them with :class:`ReferenceEmbedding` on rank 0. Prints one line per rank
and exits non-zero on a mismatch.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from hetgmp.comm import collectives
from hetgmp.comm.launch import init_distributed, shutdown
from hetgmp.embedding.module import DistributedEmbedding
from hetgmp.embedding.reference import ReferenceEmbedding


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64, help="global batch size")
    ap.add_argument("--optimizer", choices=("sgd", "adagrad"), default="adagrad")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args(argv)
    env = init_distributed(device=args.device, timeout_s=60)
    rng = np.random.default_rng(0)
    batches = [
        np.minimum(rng.zipf(1.2, (args.batch, 4)) - 1, args.rows - 1) for _ in range(args.steps)
    ]
    kw = {"optimizer": args.optimizer, "lr": 0.1, "seed": 3}
    emb = DistributedEmbedding(args.rows, args.dim, env, placement="random", **kw)
    lo = env.rank * args.batch // env.world_size
    hi = (env.rank + 1) * args.batch // env.world_size
    for ids in batches:
        out = emb(torch.from_numpy(ids[lo:hi]).to(env.device))
        ((out**2).sum() / args.batch).backward()
    sd = {k: v.cpu() for k, v in emb.state_dict().items()}
    parts = collectives.all_gather_object(env, sd)
    err = 0.0
    if env.is_main:
        ref = ReferenceEmbedding(args.rows, args.dim, **kw)
        for ids in batches:
            ((ref(torch.from_numpy(ids)) ** 2).sum() / args.batch).backward()
        want = ref.state_dict()["weight"]
        ids = torch.cat([p["ids"] for p in parts])
        got = torch.cat([p["weight"] for p in parts])
        if sorted(ids.tolist()) != list(range(args.rows)):
            err = float("inf")
        else:
            err = float((got - want[ids]).abs().max())
    err = collectives.all_gather_object(env, err)[0]
    ok = err <= 1e-5
    c = emb.counters()
    print(
        f"selfcheck rank={env.rank} world={env.world_size} launcher={env.launcher} "
        f"backend={env.backend} device={env.device} max_err={err:.3g} "
        f"bytes_sent_values={c['bytes_sent_values']} {'OK' if ok else 'MISMATCH'}",
        flush=True,
    )
    shutdown(env)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
