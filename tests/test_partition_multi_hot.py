"""The partitioner on multi-hot fields (issue 34): one sample <-> row edge per id of every
list (repeats weigh), `hetgmp partition` on such a data set, and the issue's figure -- the plan
cuts remote rows vs hash at least as much on multi-hot data (with communities) as on single-hot. Real files, the
real CLI, the native extension against numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hetgmp.cli import main as cli_main
from hetgmp.data.format import FieldInfo, make_fields, open_dataset, write_dataset
from hetgmp.data.generate import generate_criteo_like
from hetgmp.data.multi_hot import MultiHotArrays, multi_hot_paths
from hetgmp.experiments.predict import predict_fetches
from hetgmp.partition.api import partition_dataset, train_rows
from hetgmp.partition.cli import verify_plan
from hetgmp.partition.cost import soft_count
from hetgmp.partition.plan import load_plan
from hetgmp.partition.quality import usage_counts
from hetgmp.partition.sample_rows import SampleRows, combine

SPARSE = np.array([[0, 3], [1, 4], [2, 6], [0, 5]])
LABELS = np.array([0.0, 1.0, 0.0, 1.0])
# hist: [7, 8], [], [9, 16, 7], [7, 7] (an empty list and repeats); tags: [17], [18, 17], [], []
HIST = (np.array([7, 8, 9, 16, 7, 7, 7]), np.array([0, 2, 2, 5, 7]))
TAGS = (np.array([17, 18, 17]), np.array([0, 1, 3, 3, 3]))
EXPECT = [[0, 3, 7, 8, 17], [1, 4, 18, 17], [2, 6, 9, 16, 7], [0, 5, 7, 7]]


def _write(root: Path) -> None:
    write_dataset(
        root, make_fields(["a", "b"], [3, 4]), {"train": (SPARSE, None, LABELS, [HIST, TAGS])},
        multi_hot=[FieldInfo("hist", 10, 7), FieldInfo("tags", 2, 17)],
    )  # fmt: skip


def test_combine_puts_every_id_of_a_sample_in_its_list() -> None:
    rows = combine(SPARSE, [MultiHotArrays(*HIST), MultiHotArrays(*TAGS)])
    got = [rows.values[rows.offsets[s] : rows.offsets[s + 1]].tolist() for s in range(4)]
    assert got == EXPECT
    assert rows.shape == (4, 5)  # 18 ids over 4 samples, rounded up
    pad = rows.padded(np.array([3, 0]))  # distinct ids only, -1 fills (METIS's view)
    assert pad.shape == (2, 5) and [sorted(r[r >= 0].tolist()) for r in pad] == [
        [0, 5, 7],
        [0, 3, 7, 8, 17],
    ]


def test_native_counts_weigh_every_id_of_every_list() -> None:
    rows = combine(SPARSE, [MultiHotArrays(*HIST), MultiHotArrays(*TAGS)])
    dp = np.array([0, 1, 1, 0], dtype=np.int32)
    want = np.zeros((19, 2), dtype=np.int32)
    for s, ids in enumerate(EXPECT):
        for r in ids:
            want[r, dp[s]] += 1  # a repeated id adds again: row 7 counts 3 for worker 0
    got = usage_counts(rows, dp, 2, 19)
    assert np.array_equal(got, want) and got[7, 0] == 3
    bad = SampleRows(np.array([0, 19]), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="sample 1, id number 0: id 19 is outside"):
        usage_counts(bad, np.zeros(2, dtype=np.int32), 2, 19)


def test_partition_cli_reads_the_lists(tmp_path: Path, capsys) -> None:
    _write(tmp_path / "mh")
    out = tmp_path / "p.npz"
    assert cli_main(["partition", "--data", str(tmp_path / "mh"), "-n", "2", "-o", str(out),
                     "--no-progress"]) == 0  # fmt: skip
    plan = load_plan(out)
    assert plan.num_samples == 4 and plan.num_rows == 19
    ds = open_dataset(tmp_path / "mh")
    # the report counts list ids: recomputing it on the single-hot columns alone differs
    rep = verify_plan(out, tmp_path / "mh")
    assert rep["fetches_per_step"] == pytest.approx(plan.meta["quality"]["fetches_per_step"])
    assert isinstance(train_rows(ds), SampleRows)
    # METIS on a sample of the lists (an edge budget below the graph's), the rest placed greedily
    small = partition_dataset(ds, 2, metis_max_edges=8, progress=False)
    assert "uniform sample of 2 samples" in small.meta["metis"]["why"]
    assert sorted(np.bincount(small.data_partition)) == [2, 2]
    # a list id outside its field's range is named with its file, before any graph is built
    values = multi_hot_paths(tmp_path / "mh", "train", 1)["values"]
    np.save(values, np.array([17, 18, 5]))
    assert cli_main(["partition", "--data", str(tmp_path / "mh"), "-n", "2",
                     "-o", str(tmp_path / "q.npz")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert str(values) in err and "id 5 is outside its range [17, 19)" in err


def test_predicted_fetches_count_every_list_id(tmp_path: Path) -> None:
    """The run-time prediction (experiments/predict.py) reads the lists as the plan does."""
    _write(tmp_path / "mh")
    out = tmp_path / "p.npz"
    assert cli_main(["partition", "--data", str(tmp_path / "mh"), "-n", "2", "-o", str(out),
                     "--method", "hash", "--batch-size", "2", "--no-progress"]) == 0  # fmt: skip
    plan = load_plan(out)
    got = predict_fetches(tmp_path / "mh", plan, batch_size=2)["fetches_per_step"]
    assert got == pytest.approx(plan.meta["quality"]["fetches_per_step"])
    dp, ep = plan.data_partition, plan.embed_partition

    def by_hand(lists: list[list[int]]) -> float:  # the numpy cost model, M = 4 / 2
        counts = np.zeros((19, 2), dtype=np.int64)
        for s, ids in enumerate(lists):
            for r in ids:
                counts[r, dp[s]] += 1
        return sum(float(soft_count(counts[ep != w, w], 2, 2).sum()) for w in range(2))

    assert got == pytest.approx(by_hand(EXPECT))
    assert got > by_hand([ids[:2] for ids in EXPECT])  # (the lists' ids add fetches)


def _ratio(root: Path, **kw) -> tuple[float, float, float]:
    generate_criteo_like(root, seed=3, num_samples=20000, scale=0.02, progress=False,
                         log=lambda line: None, **kw)  # fmt: skip
    plan = partition_dataset(open_dataset(root), 4, batch_size=256, progress=False)
    q = plan.meta["quality"]
    ours, hashed = q["fetches_per_step"], q["baselines"]["hash"]["fetches_per_step"]
    return ours / hashed, ours, hashed


def test_plan_cuts_remote_rows_on_multi_hot_at_least_as_much_as_single_hot(
    tmp_path: Path,
) -> None:
    """On lists with community structure (--communities: a user's history from their
    community's sub-catalogue, as real histories), the plan's share of hash's remote rows is
    well below the single-hot set's (0.19 vs 0.40 measured). On the global law's lists
    (--communities 0) it held only by a hair here and not at all on 200000 samples:
    bench/results/multi_hot_partition.md has both."""
    single, s_ours, s_hash = _ratio(tmp_path / "single")
    multi, m_ours, m_hash = _ratio(tmp_path / "multi", multi_hot="2:20", communities=16)
    print(f"single: {s_ours:.0f}/{s_hash:.0f} = {single:.3f}; multi: {m_ours:.0f}/{m_hash:.0f}"
          f" = {multi:.3f}")  # fmt: skip
    assert m_hash > 2 * s_hash  # the lists' ids are counted: many more rows per step
    assert multi < 0.7 * single and multi < 0.3  # a clear margin, not a hair
