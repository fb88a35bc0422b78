"""bench/hot_rows.py (issue 30's diagnosis): the rows a step updates more than the bound, on
ids whose counts are known."""

from __future__ import annotations

import numpy as np

from bench.hot_rows import hot_rows, table


def test_rows_over_the_bound_are_counted_exactly() -> None:
    # row 7: 5 occurrences, row 3: 3, rows 10..13 once each
    ids = np.array([7, 7, 3, 10, 7, 3, 11, 7, 12, 3, 7, 13])
    distinct, hot, hot_occ, total = hot_rows(ids, bound=2)
    assert distinct == 6 and hot.tolist() == [3, 7] and hot_occ == 8 and total == 12
    assert hot_rows(ids, bound=4)[1].tolist() == [7]


def test_report_rows_follow_the_steps() -> None:
    rng = np.random.default_rng(0)
    x = np.stack([np.zeros(64, np.int64), rng.integers(1, 10_000, 64)], 1)  # field 0: one row
    rep = table(x, [16, 128], bound=10, steps=3, dim=4, seed=0)
    lines = rep.splitlines()
    # 16-sample steps: row 0 has 16 occurrences (> 10), the random rows almost surely not
    assert lines[2].startswith("| 16 | 3 |") and "| 1 (1) | 1 |" in lines[2]
    assert "the split has 64 samples" in lines[3]  # (no 128-sample step fits)


def test_plan_table_counts_global_and_per_rank_hot_rows() -> None:
    from bench.hot_rows import plan_table

    # one step, 2 ranks: row 1 is in 30 + 30 samples (global 60 > bound 50; per rank 30 > h =
    # 50 // 4 = 12), row 2 in 13 of rank 0's (per rank only), row 3 in 40 of rank 1's (both)
    r0 = np.array([1] * 30 + [2] * 13 + [9])
    r1 = np.array([1] * 30 + [3] * 40)
    rep = plan_table([[r0, r1]], bound=50, dim=2).splitlines()
    assert rep[0].startswith("| steps | ranks | rows > 50 / global step") and "h = 12" in rep[0]
    # global: rows 1 (60) and 3 (40 < 50: no) -> 1 row, 60 of 114 occurrences; per rank: 2 + 2
    assert rep[2] == "| 1 | 2 | 1 (1) | 52.6% | 0 KiB | 2 (2) |"
