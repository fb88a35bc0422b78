"""The GPU benchmark harness (bench/gpu) in a tiny CPU configuration: 1 process + 2 gloo ranks.

Checks that every contender reports, that the bytes-per-sample figures are consistent, and that
the baselines are correct, not just fast: after the run's steps, contenders (a) torch, (b)
rowwise, (c) tablewise and hetgmp at bound 0 hold the same rows as the single-process
ReferenceEmbedding fed the same global batches and gradients. No timings are asserted.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu.contenders import INIT_SCALE, balance_tables  # noqa: E402
from bench.gpu.data import WorkloadSpec, load_workload, make_ids, prepare, rank_samples  # noqa: E402
from bench.gpu.harness import RunConfig, batch_positions, fixed_grad, run_rank, write_json  # noqa: E402
from bench.gpu.report import write_report  # noqa: E402
from hetgmp.comm.env import DistEnv  # noqa: E402
from hetgmp.comm.spawn import spawn_ranks  # noqa: E402
from hetgmp.embedding import ReferenceEmbedding  # noqa: E402
from hetgmp.partition.plan import load_plan  # noqa: E402

BATCH, DIM = 64, 8
ONE = ["torch", "hetgmp"]
TWO = ["rowwise", "tablewise", "hetgmp-hash", "hetgmp-b0", "hetgmp-b100", "hetgmp-b0-pad"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Prepare a tiny local-heavy workload, run the harness on 1 and on 2 ranks."""
    root = tmp_path_factory.mktemp("benchgpu")
    spec = WorkloadSpec(
        num_samples=3000, card_scale=2e-4, locality=0.95, samples_per_user=100, seed=3,
        world_size=2, method="metis+refine", rounds=1, batch_size=BATCH, max_mirror_rate=0.05,
    )  # fmt: skip
    wl = prepare(root / "wl", spec, threads=1)
    base = dict(
        workload=str(wl.root), batches=[BATCH], precisions=["fp32"], dim=DIM, warmup=1,
        steps=1, profile_steps=1, seed=5, lr=0.05, store_rate=0.05, return_rows=True,
    )  # fmt: skip
    cfg1 = RunConfig(contenders=ONE, modes=["embedding", "train"], **base)
    cfg2 = RunConfig(contenders=TWO, modes=["embedding", "train"], **base)
    one = run_rank(DistEnv.single("cpu"), cfg1)
    two = spawn_ranks(run_rank, 2, dataclasses.asdict(cfg2), timeout_s=120)
    out = root / "out"
    out.mkdir()
    write_json(out / "results_w1.json", one)
    write_json(out / "results_w2.json", two[0])
    return {"wl": wl, "one": one, "two": two, "out": out, "cfg": cfg2}


def _rec(payload: dict, contender: str, mode: str = "embedding") -> dict:
    for r in payload["results"]:
        if r["contender"] == contender and r["mode"] == mode:
            return r
    raise AssertionError(f"no {mode} record for {contender}")


def _reference_rows(wl, cfg: RunConfig, part: np.ndarray | None, world: int) -> np.ndarray:
    """Rows after the run's steps of single-process SGD on the same global batches."""
    ids_all = np.asarray(wl.ids(), dtype=np.int64)
    shards = [
        torch.from_numpy(ids_all[rank_samples(part, ids_all.shape[0], r, world)])
        for r in range(world)
    ]  # fmt: skip
    ref = ReferenceEmbedding(wl.num_rows, DIM, lr=cfg.lr, seed=cfg.seed, init_scale=INIT_SCALE)
    grads = [
        fixed_grad(BATCH, wl.num_fields, DIM, r, cfg.seed, torch.device("cpu"))
        for r in range(world)
    ]
    for k in range(cfg.warmup + cfg.steps + cfg.profile_steps):
        batch = [s[batch_positions(k, BATCH, s.shape[0], torch.device("cpu"))] for s in shards]
        out = ref(torch.cat(batch))
        out.backward(torch.cat(grads))
    ref.flush()
    return ref.weight.numpy()


def _assembled(payloads: list[dict], contender: str, num_rows: int) -> np.ndarray:
    rows = np.full((num_rows, DIM), np.nan, dtype=np.float32)
    for p in payloads:
        ids, w = _rec(p, contender)["rows"]
        rows[ids] = w
    assert not np.isnan(rows).any(), f"{contender}: the ranks' rows do not cover the table"
    return rows


def test_every_contender_reports(runs: dict) -> None:
    for payload, names in ((runs["one"], ONE), (runs["two"][0], TWO)):
        for name in names:
            for mode in ("embedding", "train"):
                r = _rec(payload, name, mode)
                assert r["samples_per_s"] > 0 and r["step_ms_median"] > 0
                assert r["bytes_per_sample"] >= 0 and r["phases_ms"]
            assert _rec(payload, name)["floor"]["samples_per_s"] > 0
    # every rank returns the same records
    a, b = runs["two"]
    assert [r["samples_per_s"] for r in a["results"]] == [r["samples_per_s"] for r in b["results"]]


def test_bytes_per_sample_consistent(runs: dict) -> None:
    one, two = runs["one"], runs["two"][0]
    assert _rec(one, "torch")["bytes_per_sample"] == 0
    assert _rec(one, "hetgmp")["bytes_per_sample"] == 0
    row = _rec(two, "rowwise")
    table = _rec(two, "tablewise")
    # (b): ids out, values back, gradients out: 8 + 2 * 4 * D bytes per remote unique row.
    kinds = row["bytes_per_sample_by_kind"]
    assert kinds["values"] == pytest.approx(kinds["gradients"])
    assert kinds["ids"] * 4 * DIM / 8 == pytest.approx(kinds["values"])
    assert row["bytes_per_sample"] > 0 and table["bytes_per_sample"] > 0
    part = _rec(two, "hetgmp-b100")
    assert row["bytes_per_sample"] > 1.5 * part["bytes_per_sample"]
    assert _rec(two, "hetgmp-hash")["bytes_per_sample"] > part["bytes_per_sample"]
    assert part["rows_share"]["owned"] > _rec(two, "hetgmp-hash")["rows_share"]["owned"]
    # embedding-only and training steps move the same ids
    assert _rec(two, "rowwise", "train")["bytes_per_sample"] == pytest.approx(
        row["bytes_per_sample"]
    )


def test_baselines_match_reference_sgd(runs: dict) -> None:
    wl, cfg = runs["wl"], runs["cfg"]
    ref1 = _reference_rows(wl, cfg, None, 1)
    for name in ONE:
        got = _assembled([runs["one"]], name, wl.num_rows)
        np.testing.assert_allclose(got, ref1, rtol=0, atol=2e-6, err_msg=name)
    ref2 = _reference_rows(wl, cfg, None, 2)
    assert not np.allclose(ref2, ref1)  # the steps did change rows
    for name in ("rowwise", "tablewise", "hetgmp-hash"):
        got = _assembled(runs["two"], name, wl.num_rows)
        np.testing.assert_allclose(got, ref2, rtol=0, atol=2e-6, err_msg=name)
    plan = load_plan(wl.plan_path())
    ref_plan = _reference_rows(wl, cfg, plan.data_partition, 2)
    for name in ("hetgmp-b0", "hetgmp-b0-pad"):
        got = _assembled(runs["two"], name, wl.num_rows)
        np.testing.assert_allclose(got, ref_plan, rtol=0, atol=2e-6, err_msg=name)


def test_report_files(runs: dict) -> None:
    js, md, table = write_report(runs["out"], runs["wl"].root)
    data = json.loads(js.read_text())
    names = {r["contender"] for run in data["runs"] for r in run["results"]}
    assert names == set(ONE) | set(TWO)
    text = md.read_text()
    assert "Embedding step alone" in text and "Full training step" in text
    assert "hetgmp-b100" in table


def test_workload_law_and_errors(tmp_path: Path) -> None:
    cards = np.array([10, 1000, 3])
    ids = make_ids(20000, cards, locality=0.0, samples_per_user=10, seed=0, threads=1)
    assert ids.min() == 0 and ids.max() < cards.sum()
    # floor(u^4 * card): P(local id < card / 16) = P(u < 1/2) = 1/2
    local = ids[:, 1] - 10
    assert abs(np.mean(local < 1000 / 16) - 0.5) < 0.02
    # the same marginal law with locality
    loc = make_ids(20000, cards, locality=0.9, samples_per_user=10, seed=0, threads=1)
    assert abs(np.mean(loc[:, 1] - 10 < 1000 / 16) - 0.5) < 0.05
    np.testing.assert_array_equal(
        make_ids(5000, cards, locality=0.5, samples_per_user=10, seed=1, threads=1),
        make_ids(5000, cards, locality=0.5, samples_per_user=10, seed=1, threads=2),
    )
    assert list(balance_tables(np.array([5, 9, 4, 1]), 2)) == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="locality"):
        WorkloadSpec(locality=2.0).check()
    with pytest.raises(FileNotFoundError, match="prepare"):
        load_workload(tmp_path)
    with pytest.raises(ValueError, match="one-GPU baseline"):
        RunConfig(workload="x", contenders=["torch"]).check(2)
