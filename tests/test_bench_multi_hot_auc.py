"""bench/multi_hot_auc.sh's helpers (issue 34): the interleaved plan gives two unshuffled ranks
exactly the one-rank run's global batches, the ceiling rebuilds the generator's model (its AUC is
best_auc) and removes the interactions, and the report's table and verdicts. No training here:
the whole script takes ~35 s even with tiny knobs (run it by hand, see its header)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import multi_hot_auc  # noqa: E402
from hetgmp.data.format import open_dataset  # noqa: E402
from hetgmp.data.generate import generate_criteo_like  # noqa: E402
from hetgmp.data.loader import BatchLoader, rank_sample_indices  # noqa: E402
from hetgmp.partition.plan import Plan, load_plan, save_plan  # noqa: E402


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mh_auc") / "ds"
    generate_criteo_like(out, num_samples=3000, scale=0.0005, multi_hot="2:4", seed=2,
                         progress=False)  # fmt: skip
    return out


@pytest.mark.parametrize("half", [32, 100, 7])
def test_interleaved_plan_gives_the_one_rank_global_batches(dataset: Path, tmp_path: Path,
                                                            half: int) -> None:  # fmt: skip
    ds = open_dataset(dataset)
    n, rows = len(ds.train), ds.meta.num_embeddings
    rng = np.random.default_rng(0)
    ep = rng.integers(0, 2, rows).astype(np.int32)
    plan = Plan(rng.integers(0, 2, n).astype(np.int32), ep,
                [np.flatnonzero(ep != w)[:5].astype(np.int64) for w in range(2)],
                {"dataset_fingerprint": ds.fingerprint})  # fmt: skip
    path = save_plan(multi_hot_auc.interleave(plan, half), tmp_path / "p.npz")
    got = load_plan(path)
    assert np.array_equal(got.embed_partition, ep)  # (the rows' placement kept)
    one = BatchLoader(ds.train, 2 * half)
    ranks = [BatchLoader(ds.train, half, indices=rank_sample_indices(n, r, 2, got)) for r in (0, 1)]
    steps = max(len(r) for r in ranks)
    assert steps == len(one)
    for t in range(steps):
        parts = [r.batch_indices(t) for r in ranks if t < len(r)]
        assert np.array_equal(np.sort(np.concatenate(parts)), one.batch_indices(t)), t


def test_interleave_refuses_other_part_counts() -> None:
    plan = Plan(np.zeros(4, np.int32), np.zeros(3, np.int32), [np.zeros(0, np.int64)] * 3)
    with pytest.raises(SystemExit, match="2-part"):
        multi_hot_auc.interleave(plan, 2)


def test_ceiling_rebuilds_best_auc_and_drops_the_interactions(dataset: Path) -> None:
    c = multi_hot_auc.ceiling(dataset)  # (raises if the rebuilt AUC is not meta's best_auc)
    assert c["best_auc"] == pytest.approx(open_dataset(dataset).meta.best_auc, abs=1e-6)
    assert 0.5 < c["first_order_auc"] < c["best_auc"]
    assert c["interaction_logit_std"] > 0.05


def _write(res: Path, name: str, auc: float, loss: float, losses: list[float]) -> None:
    rec = {"val_auc": auc, "val_loss": loss, "step": 10, "speed": 1000.0}
    (res / f"{name}.json").write_text(json.dumps(rec))
    lines = [
        json.dumps({"kind": "train", "step": 5 * (i + 1), "loss": v}) for i, v in enumerate(losses)
    ]
    (res / f"{name}.jsonl").write_text("\n".join([json.dumps({"kind": "config"}), *lines]) + "\n")


def test_report_table_gap_and_equality_verdict(tmp_path: Path) -> None:
    (tmp_path / "ceiling.json").write_text(json.dumps({"best_auc": 0.76, "first_order_auc": 0.75}))
    _write(tmp_path, "one", 0.755, 0.48, [0.5])
    _write(tmp_path, "eq-one", 0.74, 0.49, [0.6, 0.5])
    _write(tmp_path, "eq-two", 0.74, 0.49, [0.6, 0.50002])
    (tmp_path / "two-b0.log").write_text("start\nRuntimeError: gloo | broke\n")
    text = multi_hot_auc.report(tmp_path, "cmd")
    assert "**met** (gap 0.0050)" in text and "**EQUAL** at 1e-4" in text
    assert "| one | 1 rank, batch B, shuffled | 0.7550 | 0.0050 | -0.0050 | 0.4800 |" in text
    assert "| two-b0 |" in text and "failed: RuntimeError: gloo / broke" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert len({r.count("|") for r in rows}) == 1  # (the table stays rectangular)
    _write(tmp_path, "eq-two", 0.74, 0.49, [0.6, 0.5003])  # a train loss off by 3e-4
    assert "**NOT EQUAL** at 1e-4" in multi_hot_auc.report(tmp_path, "cmd")


def test_script_syntax() -> None:
    subprocess.run(["bash", "-n", str(ROOT / "bench/multi_hot_auc.sh")], check=True)
