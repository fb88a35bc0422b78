"""The criteo-like generator: determinism, statistics, locality, labels; dataset info/verify."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hetgmp.cli import main as cli_main
from hetgmp.config import ConfigError
from hetgmp.data.format import SPLITS, array_paths, open_dataset
from hetgmp.data.generate import (
    CRITEO_CARDINALITIES,
    CriteoLikeConfig,
    PowerLaw,
    build_model,
    excess_repeat_rate,
    generate_chunk,
    generate_criteo_like,
    sample_users,
    scaled_cardinalities,
    solve_bias,
)
from hetgmp.data.verify import verify_dataset
from hetgmp.metrics import roc_auc

SMALL = dict(num_samples=20_000, scale=0.002, progress=False, log=lambda line: None)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return generate_criteo_like(tmp_path_factory.mktemp("gen") / "ds", seed=7, **SMALL)


def _files(root: Path) -> dict[str, bytes]:
    out = {}
    for split in SPLITS:
        for kind, p in array_paths(root, split).items():
            out[f"{split}/{kind}"] = p.read_bytes()
    out["probs"] = (root / "test_true_probs.npy").read_bytes()
    return out


def test_same_seed_is_byte_identical_for_any_chunking(small, tmp_path: Path) -> None:
    other = generate_criteo_like(tmp_path / "b", seed=7, chunk_size=777, workers=3, **SMALL)
    assert _files(small.root) == _files(other.root)
    assert other.meta.fingerprint == small.meta.fingerprint
    assert other.meta.best_auc == small.meta.best_auc


def test_different_seed_differs(small, tmp_path: Path) -> None:
    other = generate_criteo_like(tmp_path / "c", seed=8, **SMALL)
    assert other.meta.fingerprint != small.meta.fingerprint
    a, b = np.asarray(small.train.sparse), np.asarray(other.train.sparse)
    assert (a != b).mean() > 0.3


def test_shape_cardinalities_and_id_ranges(small) -> None:
    m = small.meta
    cards = scaled_cardinalities(0.002)
    assert m.num_fields == 26 and m.num_dense == 13
    assert [f.cardinality for f in m.fields] == cards.tolist()
    assert cards.min() >= 2 and cards[2] == round(CRITEO_CARDINALITIES[2] * 0.002)
    assert m.splits == {"train": 18_000, "test": 2_000}
    for split in (small.train, small.test):
        sp = np.asarray(split.sparse)
        assert sp.dtype == np.int32
        assert (sp >= m.field_offsets).all() and (
            sp < m.field_offsets + m.field_cardinalities
        ).all()
        assert np.isfinite(np.asarray(split.dense)).all()
        assert set(np.unique(split.labels)) <= {0.0, 1.0}
    assert verify_dataset(small.root).ok


def test_power_law_skew(small) -> None:
    st = small.meta.stats
    cards = small.meta.field_cardinalities
    sp = np.asarray(small.train.sparse) - small.meta.field_offsets
    big = int(np.argmax(cards))  # C3
    counts = np.sort(np.bincount(sp[:, big], minlength=int(cards[big])))[::-1]
    top1 = counts[: max(1, cards[big] // 100)].sum() / counts.sum()
    # A uniform field would put ~1 % of draws on 1 % of ids; a power law far more.
    assert top1 > 0.3
    assert st["distinct_ids_per_field"][big] < cards[big]
    assert len(st["top1pct_id_share_per_field"]) == 26
    # stats count train+test exactly
    full = np.concatenate([sp, np.asarray(small.test.sparse) - small.meta.field_offsets])
    assert st["distinct_ids_per_field"] == [int(np.unique(full[:, f]).size) for f in range(26)]


def test_power_law_sampler_matches_its_pmf() -> None:
    law = PowerLaw(np.array([50]), np.array([1.2]))
    u = np.random.default_rng(0).random((200_000, 1))
    ranks = law.ranks(u)[:, 0]
    freq = np.bincount(ranks, minlength=50) / ranks.size
    np.testing.assert_allclose(freq, law.pmf(0), atol=0.004)
    assert law.pmf(0).sum() == pytest.approx(1.0)
    assert law.pmf(0)[0] > 5 * law.pmf(0)[-1]


def test_positive_rate_and_best_auc(small, tmp_path: Path) -> None:
    st = small.meta.stats
    assert abs(st["positive_rate_train"] - 0.25) < 0.02
    assert abs(float(np.asarray(small.train.labels).mean()) - st["positive_rate_train"]) < 1e-6
    probs = np.load(small.root / "test_true_probs.npy")
    labels = np.asarray(small.test.labels).ravel()
    assert small.meta.best_auc == pytest.approx(roc_auc(labels, probs), abs=1e-12)
    assert 0.6 < small.meta.best_auc < 0.95
    # The labels really come from the probabilities: calibrated on average.
    assert abs(probs.mean() - labels.mean()) < 0.03
    other = generate_criteo_like(tmp_path / "p", seed=7, positive_rate=0.1, **SMALL)
    assert abs(other.meta.stats["positive_rate_train"] - 0.1) < 0.015


def test_solve_bias_hits_the_target() -> None:
    z = np.random.default_rng(1).normal(0, 1.5, 10_000)
    b = solve_bias(z, 0.25)
    assert (1 / (1 + np.exp(-(b + z)))).mean() == pytest.approx(0.25, abs=1e-6)


def _locality_score(locality: float) -> float:
    n = 20_000
    cfg = CriteoLikeConfig(num_samples=n, scale=0.01, locality=locality, samples_per_user=50.0)
    m = build_model(cfg, n)
    chunk = generate_chunk(m, 0, n)
    users = sample_users(m, 0, n)
    big = [f for f in range(26) if m.cards[f] > 1000]
    return float(np.mean([excess_repeat_rate(users, chunk.local[:, f]) for f in big]))


def test_locality_knob_increases_reuse_within_users() -> None:
    none, mid, strong = (_locality_score(x) for x in (0.0, 0.5, 1.0))
    assert abs(none) < 0.05
    assert mid > none + 0.2
    assert strong > mid + 0.2


def test_users_follow_power_law_activity() -> None:
    cfg = CriteoLikeConfig(num_samples=50_000, scale=0.001, samples_per_user=100.0)
    users = sample_users(build_model(cfg, 50_000), 0, 50_000)
    per_user = np.bincount(users)
    assert per_user.size <= 500
    assert per_user.max() > 5 * per_user.mean()


def test_verify_catches_corruption(small, tmp_path: Path, capsys) -> None:
    import shutil

    root = tmp_path / "bad"
    shutil.copytree(small.root, root)
    assert cli_main(["dataset", "verify", str(root)]) == 0
    path = array_paths(root, "train")["sparse"]
    arr = np.load(path, mmap_mode="r+")
    arr[5, 2] = arr[5, 2] + 10**6  # out of C3's range
    arr.flush()
    del arr
    lab = np.load(array_paths(root, "test")["labels"], mmap_mode="r+")
    lab[3, 0] = 2.0
    lab.flush()
    del lab
    dense = np.load(array_paths(root, "train")["dense"], mmap_mode="r+")
    dense[7, 1] = np.nan
    dense.flush()
    del dense
    rep = verify_dataset(root)
    text = "\n".join(rep.failures)
    assert "fingerprint mismatch" in text
    assert "field C3" in text and "row 5" in text
    assert "labels not 0/1; first at row 3" in text
    assert "NaN/inf; first at row 7" in text
    assert cli_main(["dataset", "verify", str(root)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_verify_truncated_file_is_a_clear_error(small, tmp_path: Path, capsys) -> None:
    import shutil

    root = tmp_path / "trunc"
    shutil.copytree(small.root, root)
    p = array_paths(root, "train")["labels"]
    p.write_bytes(p.read_bytes()[:1000])
    assert cli_main(["dataset", "verify", str(root)]) == 2
    assert "train_labels.npy" in capsys.readouterr().err


def test_cli_generate_and_info(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cli"
    rc = cli_main(["generate", "criteo-like", "--out", str(out), "--num-samples", "3000",
                   "--scale", "0.001", "--seed", "3", "--no-progress"])  # fmt: skip
    assert rc == 0
    ds = open_dataset(out)
    assert ds.meta.splits == {"train": 2700, "test": 300}
    assert ds.meta.source["config"]["seed"] == 3
    assert cli_main(["dataset", "info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "best_auc" in text and ds.meta.fingerprint in text
    # Existing output is refused unless --overwrite.
    assert cli_main(["generate", "criteo-like", "--out", str(out), "--num-samples", "3000"]) == 2
    assert "already exists" in capsys.readouterr().err


def test_bad_options_name_the_option(tmp_path: Path, capsys) -> None:
    rc = cli_main(["generate", "criteo-like", "--out", str(tmp_path / "x"), "--locality", "1.5"])
    assert rc == 2
    assert "locality" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="num_samples"):
        generate_criteo_like(tmp_path / "y", num_samples=1)
    assert not (tmp_path / "x").exists()
