"""Reproduce the calibration of the criteo-like generator against the real samples.

Reads ``../shared/datasets`` in place (never copies it) and prints:

1. per Criteo field, the distinct-value count of ``criteo-sample`` (8,000 real rows), the power-law
   exponent whose expected distinct count in 8,000 draws matches it, and the exponent the generator
   uses (``CRITEO_ZIPF_EXPONENTS``);
2. MovieLens-100k user statistics (samples per user, Gini) and the excess within-user repeat rate
   of its non-user fields, next to the generator's at several ``locality`` values with the same
   number of samples and users.

Usage: ``python bench/bench_generate_calibrate.py [--datasets ../shared/datasets]``.
Prints only aggregate statistics; nothing derived from the real data is written to the repository.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from hetgmp.data.generate import (
    CRITEO_CARDINALITIES,
    CRITEO_ZIPF_EXPONENTS,
    CriteoLikeConfig,
    PowerLaw,
    build_model,
    excess_repeat_rate,
    expected_distinct,
    generate_chunk,
    sample_users,
)

ROOT = Path(__file__).resolve().parents[1]


def fit_exponent(card: int, distinct: int, draws: int) -> float:
    """Exponent whose expected distinct count in ``draws`` draws equals ``distinct`` (bisection)."""

    def ed(a: float) -> float:
        return expected_distinct(PowerLaw(np.array([card]), np.array([a])).pmf(0), draws)

    lo, hi = 0.0, 3.0
    if distinct >= 0.9 * card:
        return float("nan")  # sample nearly exhausts the field: exponent not identifiable
    for _ in range(40):
        mid = (lo + hi) / 2
        if ed(mid) > distinct:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def criteo_part(root: Path) -> None:
    rows = []
    for name in ("train.csv", "dev.csv", "test.csv"):
        with open(root / name, newline="") as f:
            rows.extend(csv.reader(f, delimiter="\t"))
    cats = list(zip(*[r[14:40] for r in rows], strict=True))
    print(f"criteo-sample: {len(rows)} rows")
    print("field  cardinality  distinct  fitted_a  generator_a")
    for f, col in enumerate(cats):
        d = len(set(col))
        a = fit_exponent(CRITEO_CARDINALITIES[f], d, len(rows))
        print(
            f"C{f + 1:<4} {CRITEO_CARDINALITIES[f]:>11} {d:>9} {a:>9.2f} {CRITEO_ZIPF_EXPONENTS[f]:>12.2f}"
        )


def movielens_part(root: Path, localities: list[float]) -> None:
    data = np.loadtxt(root / "u.data", dtype=np.int64)
    data = data[np.argsort(data[:, 3], kind="stable")]
    user, item = data[:, 0], data[:, 1]
    users = {}
    with open(root / "u.user", encoding="latin-1") as f:
        for line in f:
            uid, age, gender, occ, zipc = line.strip().split("|")
            users[int(uid)] = (int(age) // 10, gender, occ, zipc[:2])
    genre = {}
    with open(root / "u.item", encoding="latin-1") as f:
        for line in f:
            parts = line.rstrip("\n").split("|")
            flags = [int(x) for x in parts[5:24]]
            genre[int(parts[0])] = flags.index(1) if 1 in flags else 0
    cols = {"item": item, "genre": np.array([genre[i] for i in item])}
    for k, name in enumerate(("age", "gender", "occupation", "zip2")):
        vals = [users[u][k] for u in user]
        _, inv = np.unique(np.array(vals), return_inverse=True)
        cols[name] = inv
    per_user = np.bincount(user)[1:]
    s = np.sort(per_user)
    n = s.size
    gini = float((2 * np.arange(1, n + 1) - n - 1) @ s / (n * s.sum()))
    print(f"\nmovielens-100k: {user.size} ratings, {n} users, mean {per_user.mean():.1f} per user, "
          f"median {np.median(per_user):.0f}, Gini {gini:.3f}")  # fmt: skip
    ex = {k: excess_repeat_rate(user, v) for k, v in cols.items()}
    print("excess within-user repeat rate: " + ", ".join(f"{k} {v:.3f}" for k, v in ex.items()))
    print(f"mean over non-user fields: {np.mean(list(ex.values())):.3f}")

    print("\ngenerator (scale 1, same samples and samples per user):")
    for loc in localities:
        cfg = CriteoLikeConfig(num_samples=user.size, scale=1.0, locality=loc, seed=0,
                               samples_per_user=float(per_user.mean()))  # fmt: skip
        m = build_model(cfg, user.size)
        c = generate_chunk(m, 0, user.size)
        u = sample_users(m, 0, user.size)
        vals = [excess_repeat_rate(u, c.local[:, f]) for f in range(m.num_fields)]
        pu = np.bincount(u)
        pu = np.sort(pu[pu > 0])
        g = float((2 * np.arange(1, pu.size + 1) - pu.size - 1) @ pu / (pu.size * pu.sum()))
        print(
            f"locality {loc:.2f}: mean excess repeat {np.mean(vals):.3f}; users {pu.size}, Gini {g:.3f}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", type=Path, default=ROOT.parent / "shared" / "datasets")
    p.add_argument("--localities", type=float, nargs="+", default=[0.0, 0.5, 0.6, 0.65, 0.7, 1.0])
    a = p.parse_args(argv)
    if not a.datasets.is_dir():
        print(
            f"real samples not found at {a.datasets}; nothing to calibrate against", file=sys.stderr
        )
        return 1
    criteo_part(a.datasets / "criteo-sample")
    movielens_part(a.datasets / "movielens-100k", a.localities)
    return 0


if __name__ == "__main__":
    sys.exit(main())
