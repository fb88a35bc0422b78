"""hetgmp's Python API end to end: data, plan, model, training, evaluation, checkpoint, reload.

Runs as one process or under a launcher (gloo on CPU, NCCL on GPUs)::

    python examples/python_api.py
    mpirun -np 2 python examples/python_api.py
    torchrun --standalone --nproc_per_node 2 examples/python_api.py

Every rank runs this same script and makes the same calls in the same order: the calls that
take ``env`` are collective. docs/python_api.md walks through it.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import hetgmp

LEARNED_SHARE = 0.75  # of the way from chance to the best AUC (1 epoch at 1 and 2 ranks: 0.8-0.9)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    default_work = Path(tempfile.gettempdir()) / "hetgmp-python-api"
    p.add_argument("--work", type=Path, default=default_work, help="data, plan and checkpoints")
    p.add_argument("--samples", type=int, default=20_000, help="samples of the generated data")
    p.add_argument(
        "--steps",
        type=int,
        default=0,
        help="global training steps (0: one epoch at any rank count)",
    )
    p.add_argument("--batch-size", type=int, default=128, help="samples per rank per step")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads per rank (0: auto)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    with hetgmp.distributed(device=args.device, threads=args.threads) as env:
        say = print if env.is_main else (lambda *a, **k: None)
        say(f"{env.world_size} rank(s) ({env.launcher}), device {env.device}")

        # 1. Data: a small synthetic Criteo-like set (rank 0 writes it once; all open it).
        ds = hetgmp.generate_dataset(args.work / "data", env=env, num_samples=args.samples)
        say(f"data: {len(ds.train)} train / {len(ds.test)} test samples, "
            f"{ds.meta.num_fields} fields, {ds.meta.num_embeddings} rows")  # fmt: skip

        # 2. Plan: samples and rows placed for this many ranks (one rank: nothing to place).
        plan = None
        if env.world_size > 1:
            out = args.work / f"plan-{env.world_size}.npz"
            plan = hetgmp.make_plan(ds, env=env, out=out, batch_size=args.batch_size)

        # 3. Model: WDL around the distributed table; each rank mirrors 10% of the rows.
        options = dict(model="wdl", embed_dim=8, lr=0.05, store_rate=0.1 if plan else 0.0)
        model = hetgmp.build_model(ds, env, plan, seed=0, **options)

        # 4. Train, evaluate (exact AUC over the whole test split), checkpoint. One epoch by
        # default: the global batch grows with the ranks, so a fixed step count trained 2 ranks
        # twice the epochs of one, and this small set over-fits past one.
        per_epoch = -(-len(ds.train) // (args.batch_size * env.world_size))
        steps = args.steps or per_epoch
        trainer = hetgmp.Trainer(
            model, ds, env, batch_size=args.batch_size, iters=steps, log_every=100
        )
        results = trainer.fit()
        checkpoint = trainer.save(args.work / "checkpoints")
        say(f"trained: {results['step']} steps, val_auc {results['val_auc']:.6f}")

        # 5. A fresh model (other initial values), restored from the checkpoint: same AUC.
        fresh = hetgmp.build_model(ds, env, plan, seed=1, **options)
        restored = hetgmp.Trainer(fresh, ds, env, batch_size=args.batch_size, verbose=False)
        restored.load(checkpoint)
        again = restored.evaluate()
        say(f"reloaded: step {restored.global_step}, val_auc {again.val_auc:.6f}")
        if again.val_auc != results["val_auc"]:
            raise SystemExit(f"AUC differs after reload: {again.val_auc} vs {results['val_auc']}")
        check_learned(results["val_auc"], ds.meta.best_auc, steps / per_epoch)
        say(f"OK: val_auc {results['val_auc']:.4f} of the best possible {ds.meta.best_auc:.4f}")


def check_learned(auc: float, best: float, epochs: float) -> None:
    """Fail unless the model got most of the way from chance (0.5) to the data's best AUC:
    a model that barely learned, or over-fitted, must not print OK."""
    floor = 0.5 + LEARNED_SHARE * (best - 0.5)
    if auc < floor:
        raise SystemExit(
            f"val_auc {auc:.4f} is below {floor:.4f} ({LEARNED_SHARE:.0%} of the way from chance "
            f"to the best possible {best:.4f}) after {epochs:.1f} epoch(s): more than one epoch "
            "over-fits this small set; fewer --steps, or more --samples"
        )


if __name__ == "__main__":
    main()
