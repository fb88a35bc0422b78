"""Partition plans: every method, determinism, the cost the native code reports, the report, CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hetgmp.cli import main as hetgmp_main
from hetgmp.data.format import make_fields, write_dataset
from hetgmp.native import native
from hetgmp.partition import cost
from hetgmp.partition.api import METHODS, partition_dataset, partition_ids
from hetgmp.partition.baselines import balanced_random, hash_plan, random_plan
from hetgmp.partition.plan import PlanError, load_plan, save_plan
from hetgmp.partition.quality import rank_mirrors

NPARTS = 4


def planted(seed: int = 0, n: int = 4000, clusters: int = NPARTS, rows_per: int = 150, f: int = 4):
    """Samples in ``clusters`` groups; each group draws its ids from its own rows, with 5 % noise."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, clusters, n)
    per_field = clusters * rows_per
    local = group[:, None] * rows_per + (rng.random((n, f)) ** 2 * rows_per).astype(np.int64)
    noise = rng.random((n, f)) < 0.05
    local[noise] = rng.integers(0, per_field, noise.sum())
    ids = local + np.arange(f) * per_field
    return ids.astype(np.int32), per_field * f


@pytest.fixture(scope="module")
def graph():
    return planted()


@pytest.mark.parametrize("method", METHODS)
def test_every_method_gives_a_valid_balanced_plan(graph, method):
    ids, rows = graph
    plan = partition_ids(ids, rows, NPARTS, method=method, batch_size=64, rounds=3,
                         report_baselines=False, progress=False)
    assert plan.data_partition.shape == (ids.shape[0],)
    assert plan.embed_partition.shape == (rows,)
    assert plan.data_partition.min() >= 0 and plan.data_partition.max() < NPARTS
    assert plan.embed_partition.min() >= 0 and plan.embed_partition.max() < NPARTS
    q = plan.meta["quality"]
    assert q["max_over_mean"]["samples"] <= 1.05  # stated tolerance: 5 % over the mean
    assert q["max_over_mean"]["rows"] <= 1.10
    for w, mir in enumerate(plan.mirrors):
        assert not np.any(plan.embed_partition[mir] == w)  # never mirror an owned row
        assert len(np.unique(mir)) == len(mir)


def test_metis_refine_beats_random_on_planted_clusters(graph):
    ids, rows = graph
    res = {m: partition_ids(ids, rows, NPARTS, method=m, batch_size=64, report_baselines=False,
                            progress=False).meta["quality"]["fetches_per_step"]
           for m in ("random", "hash", "refine", "metis+refine")}
    assert res["metis+refine"] < 0.35 * res["random"]
    assert res["metis+refine"] < 0.35 * res["hash"]
    assert res["refine"] < res["random"]
    assert res["metis+refine"] <= res["refine"] * 1.02


def test_refinement_never_raises_the_cost_much_and_counts_stay_exact(graph):
    ids, rows = graph
    rng = np.random.default_rng(3)
    dp, ep = balanced_random(ids.shape[0], NPARTS, rng), balanced_random(rows, NPARTS, rng)
    topo = cost.topology_matrix(NPARTS, gpus_per_node=2, intra_cost=0.2)
    ref = native().Refiner(ids, dp, ep, NPARTS, rows, 64, topo)
    m = ref.samples_per_part
    costs = []
    for _ in range(3):
        ref.refine_data()
        ref.refine_embed()
        # the cost the native code reports equals a numpy recomputation from the placement
        dpn, epn = np.array(ref.data_partition()), np.array(ref.embed_partition())
        counts = cost.usage_counts(ids, dpn, NPARTS, rows)
        np.testing.assert_array_equal(ref.counts(), counts)
        native_cost = cost.total_cost(native().fetch_matrix(ref.counts(), epn, m, 64), topo)
        numpy_cost = cost.total_cost(cost.fetch_matrix(counts, epn, m, 64), topo)
        assert native_cost == pytest.approx(numpy_cost, rel=1e-12)
        costs.append(native_cost)
    start = cost.total_cost(cost.fetch_matrix(cost.usage_counts(ids, dp, NPARTS, rows), ep, m, 64),
                            topo)
    assert costs[-1] < 0.6 * start


@pytest.mark.parametrize("method", ["refine", "metis+refine"])
def test_same_seed_gives_identical_plans_whatever_the_threads(graph, method):
    ids, rows = graph
    plans = [partition_ids(ids, rows, NPARTS, method=method, batch_size=64, seed=7, threads=t,
                           report_baselines=False, progress=False) for t in (1, 2, 2)]
    for p in plans[1:]:
        assert p.data_partition.tobytes() == plans[0].data_partition.tobytes()
        assert p.embed_partition.tobytes() == plans[0].embed_partition.tobytes()
        assert all(a.tobytes() == b.tobytes() for a, b in zip(p.mirrors, plans[0].mirrors, strict=True))
    other = partition_ids(ids, rows, NPARTS, method="refine", batch_size=64, seed=8,
                          report_baselines=False, progress=False)
    assert other.data_partition.tobytes() != plans[0].data_partition.tobytes()


def test_quality_report_matches_numpy(graph):
    ids, rows = graph
    plan = partition_ids(ids, rows, NPARTS, method="metis+refine", batch_size=64,
                         max_mirror_rate=0.2, progress=False)
    q = plan.meta["quality"]
    topo = cost.topology_matrix(NPARTS)
    m = cost.samples_per_part(ids.shape[0], NPARTS)
    counts = cost.usage_counts(ids, plan.data_partition, NPARTS, rows)
    f = cost.fetch_matrix(counts, plan.embed_partition, m, 64)
    np.fill_diagonal(f, 0.0)
    for w, entry in enumerate(q["workers"]):
        assert entry["samples"] == int(np.sum(plan.data_partition == w))
        assert entry["fetches"] == pytest.approx(f[w].sum(), rel=1e-9)
        ranked, saved = cost.mirror_ranking(counts, plan.embed_partition, w, m, 64, topo)
        assert plan.mirrors[w].tolist() == ranked[: round(0.2 * rows)].tolist()
        k = round(0.01 * rows)
        assert entry["fetches_store_0.01"] == pytest.approx(
            max(0.0, f[w].sum() - saved[:k].sum()), rel=1e-9, abs=1e-9)
    assert q["fetches_per_step"] < q["baselines"]["random"]["fetches_per_step"]
    assert q["fetches_per_step"] < q["baselines"]["hash"]["fetches_per_step"]


def test_baseline_plans():
    p = hash_plan(10, 7, 3)
    assert p.data_partition.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert p.embed_partition.tolist() == [0, 1, 2, 0, 1, 2, 0]
    r1, r2 = random_plan(1000, 500, 4, seed=1), random_plan(1000, 500, 4, seed=1)
    assert np.array_equal(r1.data_partition, r2.data_partition)
    assert np.bincount(r1.data_partition).tolist() == [250] * 4
    ids, rows = planted(n=300)
    rp = random_plan(300, rows, NPARTS, seed=0, sparse=ids, batch_size=32, max_mirror_rate=1.0)
    want, _ = rank_mirrors(ids, rp.data_partition, rp.embed_partition, NPARTS, batch_size=32,
                           topo=None, max_mirror_rate=1.0, num_rows=rows)
    assert all(np.array_equal(a, b) for a, b in zip(rp.mirrors, want, strict=True))
    with pytest.raises(PlanError, match="at least one sample"):
        hash_plan(3, 10, 4)
    with pytest.raises(PlanError, match=">= 1"):
        random_plan(3, 10, 0)


@pytest.fixture
def small_dataset(tmp_path: Path):
    ids, rows = planted(n=3000, f=3)
    fields = make_fields(["a", "b", "c"], [rows // 3] * 3)
    labels = (np.arange(ids.shape[0]) % 3 == 0).astype(np.float32)
    return write_dataset(tmp_path / "ds", fields,
                         {"train": (ids, None, labels), "test": (ids[:100], None, labels[:100])})


def test_plan_round_trip_and_mismatch_errors(small_dataset, tmp_path):
    plan = partition_dataset(small_dataset, NPARTS, batch_size=64, progress=False)
    path = save_plan(plan, tmp_path / "part.npz")
    back = load_plan(path)
    assert np.array_equal(back.data_partition, plan.data_partition)
    assert np.array_equal(back.embed_partition, plan.embed_partition)
    assert all(np.array_equal(a, b) for a, b in zip(back.mirrors, plan.mirrors, strict=True))
    assert back.meta["quality"]["fetches_per_step"] == plan.meta["quality"]["fetches_per_step"]
    back.check_matches(num_samples=3000, num_rows=small_dataset.meta.num_embeddings,
                       fingerprint=small_dataset.fingerprint, world_size=NPARTS)
    with pytest.raises(PlanError, match="fingerprint"):
        back.check_matches(fingerprint="0" * 64)
    with pytest.raises(PlanError, match="workers"):
        back.check_matches(world_size=NPARTS + 1)


def test_cli_partition_verify_stats_and_errors(small_dataset, tmp_path, capsys):
    out = tmp_path / "p.npz"
    data = str(small_dataset.root)
    assert hetgmp_main(["partition", "-n", "4", "-o", str(out), "--data", data,
                        "--batch-size", "64", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "random:" in text and "hash:" in text and f"wrote {out}" in text
    assert hetgmp_main(["partition", "verify", str(out), "--data", data]) == 0
    assert "OK" in capsys.readouterr().out
    assert hetgmp_main(["partition", "stats", str(out)]) == 0
    assert "fetches/step" in capsys.readouterr().out

    # a plan for other data
    other_ids, rows = planted(seed=9, n=3000, f=3)
    fields = make_fields(["a", "b", "c"], [rows // 3] * 3)
    other = write_dataset(tmp_path / "other", fields,
                          {"train": (other_ids, None, np.zeros(3000, np.float32))})
    assert hetgmp_main(["partition", "verify", str(out), "--data", str(other.root)]) == 2
    assert "fingerprint" in capsys.readouterr().err
    # bad inputs: clear one-line errors, exit code 2
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    cases = [
        (["partition", "-n", "0", "--data", data], "nparts"),
        (["partition", "-n", "5000", "--data", data], "larger than the 3000 training samples"),
        (["partition", "-n", "2", "--data", str(tmp_path / "missing")], "does not exist"),
        (["partition", "stats", str(bad)], "corrupted"),
        (["partition", "stats", str(tmp_path / "nope.npz")], "does not exist"),
    ]
    for argv, msg in cases:
        assert hetgmp_main(argv) == 2, argv
        assert msg in capsys.readouterr().err, argv


def test_hetgmp_npz_without_meta_loads(tmp_path, capsys):
    path = tmp_path / "het.npz"
    np.savez(path, data_partition=np.array([0, 1, 1, 0]), embed_partition=np.array([1, 0, 1]),
             **{"0": np.array([0, 2]), "1": np.array([1])})
    assert hetgmp_main(["partition", "stats", str(path)]) == 0
    assert "no quality report" in capsys.readouterr().out


def test_real_movielens_refine_close_to_hetgmp_reference(shared_datasets):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from partition_data import movielens_graph

    ids, rows = movielens_graph(shared_datasets / "movielens-100k")
    plan = partition_ids(ids, rows, 8, method="refine", batch_size=1024, rounds=5,
                         report_baselines=False, progress=False)
    hist = plan.meta["quality"]["cost_history"]
    # HET-GMP's own code on this encoding: 9447 at its random start, 4307 after 5 rounds
    assert hist[0] == pytest.approx(9447, rel=0.03)
    assert hist[-1] == pytest.approx(4307, rel=0.05)
