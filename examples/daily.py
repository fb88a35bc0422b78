"""Daily retraining: day 1 train -> export; day 2 encoded with day 1's vocabulary (grown by the
new values) -> warm start from day 1's checkpoint -> export; AUC on day 2 against training
from scratch and against day 1's model. docs/daily.md is the same workflow on the CLI.

Runs as one process or under a launcher (every rank runs this script)::

    python examples/daily.py
    torchrun --standalone --nproc_per_node 2 examples/daily.py

The raw data is a planted click model written as CSV, one file per day and split: each value of
a field has a weight, a click is drawn from the logistic of their sum; day 2 draws a quarter of
its values from ones day 1 never had (new items), so its vocabulary grows. It prints ``OK``
only when the warm start reaches at least the from-scratch AUC of the same steps and at least
day 1's model's AUC on day 2's test split.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import hetgmp
from hetgmp.cli import main as hetgmp_cli

FIELDS, CARD = 8, 400  # categorical fields, values each on day 1
SPEC = ["--label", "click", "--dense", "d0", "d1", "--categorical",
        *[f"c{f}" for f in range(FIELDS)]]  # fmt: skip


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    default_work = Path(tempfile.gettempdir()) / "hetgmp-daily"
    p.add_argument("--work", type=Path, default=default_work, help="raw files, data, checkpoints")
    p.add_argument("--samples", type=int, default=20_000, help="training rows per day")
    p.add_argument("--epochs", type=int, default=2, help="epochs per day")
    p.add_argument("--batch-size", type=int, default=128, help="samples per rank per step")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads per rank (0: auto)")
    return p.parse_args()


def write_day(path: Path, rows: int, day: int, seed: int) -> None:
    """``rows`` CSV rows of the planted model; day 2 draws 25 % of its values from new ones."""
    truth = np.random.default_rng(0)  # (the same click model every day)
    weight = truth.normal(0.0, 1.0, (FIELDS, CARD * 2))
    rng = np.random.default_rng(seed)
    vals = np.minimum(rng.zipf(1.3, (rows, FIELDS)) - 1, CARD - 1)
    if day == 2:
        new = rng.random((rows, FIELDS)) < 0.25
        vals = np.where(new, CARD + np.minimum(rng.zipf(1.3, (rows, FIELDS)) - 1, CARD - 1), vals)
    dense = rng.normal(0.0, 1.0, (rows, 2))
    logit = weight[np.arange(FIELDS), vals].sum(1) / np.sqrt(FIELDS) + 0.5 * dense[:, 0] - 0.8
    click = rng.random(rows) < 1 / (1 + np.exp(-logit))
    with open(path, "w") as f:
        f.write("click,d0,d1," + ",".join(f"c{i}" for i in range(FIELDS)) + "\n")
        for c, d, v in zip(click, dense, vals, strict=True):
            f.write(f"{int(c)},{d[0]:.4f},{d[1]:.4f}," + ",".join(f"v{x}" for x in v) + "\n")


def prepare(work: Path, samples: int) -> None:
    """Raw files of both days, day 1 preprocessed (its vocabulary counted), day 2 encoded with
    day 1's vocabulary grown by day 2's new values (rank 0 only)."""
    work.mkdir(parents=True, exist_ok=True)
    for day in (1, 2):
        write_day(work / f"day{day}.csv", samples, day, seed=10 * day)
        write_day(work / f"day{day}_test.csv", samples // 4, day, seed=10 * day + 1)
    for day, extra in ((1, []), (2, ["--vocab-from", str(work / "day1"), "--grow-vocab"])):
        raw = work / f"day{day}.csv"
        test = ["--test-file", str(work / f"day{day}_test.csv")]
        argv = ["preprocess", "csv", str(raw), *SPEC, *test, "--out", str(work / f"day{day}"),
                "--no-progress", "--overwrite", *extra]  # fmt: skip
        if hetgmp_cli(argv) != 0:
            raise SystemExit(f"preprocess day {day} failed")


def train_day(env, work: Path, day: int, args, init_from: Path | None, tag: str) -> tuple:  # noqa: ANN001
    """Train on day ``day`` (from ``init_from`` when given); (results, checkpoint)."""
    ds = hetgmp.open_dataset(work / f"day{day}")
    plan = None
    if env.world_size > 1:  # (a plan per data set: it places the new rows as any other)
        plan = hetgmp.make_plan(ds, env=env, out=work / f"plan{day}-{env.world_size}.npz",
                                batch_size=args.batch_size)  # fmt: skip
    opts = dict(model="wdl", embed_dim=8, lr=0.05, store_rate=0.1 if plan else 0.0, seed=0)
    model = hetgmp.build_model(ds, env, plan, **opts)
    tr = hetgmp.Trainer(model, ds, env, batch_size=args.batch_size, epochs=args.epochs,
                        verbose=False)  # fmt: skip
    if init_from is not None:
        tr.init_from(init_from)  # yesterday's rows, dense weights and optimizer states
    res = tr.fit()
    return res, tr.save(work / f"ck-{tag}")


def export_and_score(work: Path, ck: Path, tag: str, test_csv: Path) -> float:
    """Export ``ck`` as a serving artifact and score ``test_csv`` with it; the AUC (rank 0)."""
    import pyarrow.parquet as pq

    from hetgmp.metrics import roc_auc

    art, out = work / f"model-{tag}", work / f"scores-{tag}.parquet"
    if hetgmp_cli(["export", str(ck), "--out", str(art), "--overwrite"]) != 0:
        raise SystemExit(f"export {ck} failed")
    if hetgmp_cli(["predict", str(art), str(test_csv), "--out", str(out), "--no-progress"]) != 0:
        raise SystemExit(f"predict with {art} failed")
    t = pq.read_table(out)
    return roc_auc(t["label"].to_numpy(), t["score"].to_numpy())


def main() -> None:
    args = parse_args()
    work = args.work
    with hetgmp.distributed(device="cpu", threads=args.threads) as env:
        say = print if env.is_main else (lambda *a, **k: None)
        say(f"{env.world_size} rank(s) ({env.launcher})")
        hetgmp.on_rank0(env, lambda: prepare(work, args.samples))
        grown = hetgmp.open_dataset(work / "day2").meta.num_embeddings
        say(f"vocabulary: day 1 {hetgmp.open_dataset(work / 'day1').meta.num_embeddings} "
            f"rows, day 2 (grown) {grown}")  # fmt: skip

        day1, ck1 = train_day(env, work, 1, args, None, "day1")
        test2 = work / "day2_test.csv"
        day1_on_2 = hetgmp.on_rank0(env, lambda: export_and_score(work, ck1, "day1", test2))
        warm, ck2 = train_day(env, work, 2, args, ck1, "day2-warm")
        scratch, _ = train_day(env, work, 2, args, None, "day2-scratch")
        served = hetgmp.on_rank0(env, lambda: export_and_score(work, ck2, "day2", test2))
        if not env.is_main:
            return
        print(f"day 1: {day1['step']} steps, val_auc {day1['val_auc']:.4f} (day 1's test)")
        print(f"day 1's model on day 2's test (exported, hetgmp predict): auc {day1_on_2:.4f}")
        print(f"day 2 from scratch: {scratch['step']} steps, val_auc {scratch['val_auc']:.4f}")
        print(f"day 2 warm start:   {warm['step']} steps, val_auc {warm['val_auc']:.4f} "
              f"(exported, hetgmp predict: {served:.4f})")  # fmt: skip
        ok = warm["val_auc"] >= scratch["val_auc"] and warm["val_auc"] >= day1_on_2
        print("OK" if ok else "FAIL: the warm start did not beat both")
        if not ok:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
