"""The generator's multi-hot communities (``--communities C``, issue 34): histories stay inside
the user's community's slice of the catalogue, the items' frequencies are the law's, the stored
true probabilities (and so best_auc) are the planted model's, and without the option the data
are byte-identical to what the generator made before it. Real files, the real CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hetgmp.cli import main as cli_main
from hetgmp.data.format import open_dataset
from hetgmp.data.generate import build_model, generate_criteo_like, sample_users
from hetgmp.data.generate_config import CriteoLikeConfig
from hetgmp.data.planted_multi_hot import build_multi_hot, multi_hot_bags
from hetgmp.data.planted_samples import generate_chunk, labels_and_probs
from hetgmp.metrics import roc_auc

SMALL = dict(num_samples=6000, scale=0.002, progress=False, log=lambda line: None)
# Made by the generator before --communities existed (commit c45b397): seed 5, SMALL.
PINNED = {
    "": ("b075b38c7c81f82a263134f36b8f35a97d84cfd9a68bcd71332f5097c7b130ba", 0.6788543371522094),
    "2:6": ("d5aa1e31ce257f2205e612245baacdbbde7c52d4493b06b53b705046a9cfca96", 0.6955841932882372),
}


@pytest.mark.parametrize("multi_hot", ["", "2:6"])
def test_without_communities_the_data_are_what_they_were(tmp_path: Path, multi_hot: str) -> None:
    ds = generate_criteo_like(tmp_path / "d", seed=5, multi_hot=multi_hot, **SMALL)
    assert (ds.meta.fingerprint, ds.meta.best_auc) == PINNED[multi_hot]
    assert "communities" not in ds.meta.source["config"]  # (meta.json as before, too)


def _lists(communities: int, global_share: float, c_of: int = 16) -> tuple[float, float]:
    """(share of list entries in the slice of the user's community ``u % c_of``, share of
    entries on the 1 % most drawn items) over 20000 samples, one field of mean length 8."""
    cfg = CriteoLikeConfig(num_samples=20_000, scale=0.01, multi_hot="1:8")
    m = build_model(cfg, 18_000)
    mm = build_multi_hot(cfg.multi_hot, cfg.scale, 0.8, cfg.seed, 18_000, 0,
                         communities=communities, global_share=global_share,
                         user_pmf=m.users.pmf(0))  # fmt: skip
    users = sample_users(m, 0, 20_000)
    values, offsets = multi_hot_bags(mm, 0, 20_000, users.astype(np.uint64))[0][0]
    owner = np.repeat(users, np.diff(offsets))
    inside = float(((values % c_of) == (owner % c_of)).mean())
    counts = np.sort(np.bincount(values))[::-1]
    return inside, float(counts[: values.max() // 100].sum() / counts.sum())


def test_histories_stay_in_the_users_community() -> None:
    inside, head = _lists(16, 0.1)
    # 90 % community draws + 1/16 of the global 10 %: 0.906 expected
    assert inside > 0.85
    # the global law's lists land in a user's slice by chance only (1/16)
    assert _lists(0, 0.0)[0] < 0.15 and _lists(16, 1.0)[0] < 0.15
    assert 0.15 < _lists(16, 0.5)[0] < 0.7  # the knob moves the share in between
    assert head > 0.05  # still a power law inside each community


def test_item_frequencies_follow_the_law() -> None:
    """The weights' taper reads the law's item probabilities: they must be the draws'."""
    cfg = CriteoLikeConfig(num_samples=20_000, scale=0.002, multi_hot="1:8")
    m = build_model(cfg, 18_000)
    mm = build_multi_hot(cfg.multi_hot, cfg.scale, 0.0, cfg.seed, 18_000, 0, communities=8,
                         global_share=0.2, user_pmf=m.users.pmf(0))  # fmt: skip
    users = sample_users(m, 0, 20_000).astype(np.uint64)
    values = multi_hot_bags(mm, 0, 20_000, users)[0][0][0]  # locality 0: fresh draws only
    shares = np.bincount(users.astype(np.int64) % 8, minlength=8) / users.size
    pmf = mm.communities.item_pmf(shares)
    assert pmf.sum() == pytest.approx(1.0)
    freq = np.bincount(values, minlength=pmf.size) / values.size
    top = np.argsort(pmf)[::-1][:20]
    np.testing.assert_allclose(freq[top], pmf[top], rtol=0.15, atol=2e-4)


def test_best_auc_is_the_planted_models(tmp_path: Path, capsys) -> None:
    out = tmp_path / "g"
    assert cli_main(["generate", "criteo-like", "--out", str(out), "--num-samples", "6000",
                     "--scale", "0.002", "--multi-hot", "2:6", "--communities", "4",
                     "--community-global", "0.2", "--seed", "5", "--no-progress"]) == 0  # fmt: skip
    ds = open_dataset(out)
    src = ds.meta.source
    assert src["config"]["communities"] == 4 and src["config"]["community_global"] == 0.2
    probs = np.load(out / "test_true_probs.npy")
    labels = np.asarray(ds.test.labels).ravel()
    assert ds.meta.best_auc == pytest.approx(roc_auc(labels, probs), abs=1e-12)
    # The stored probabilities are the planted model's, lists' pooled weights included:
    # rebuild the model from the options and the recorded bias, redraw the test split.
    cfg = CriteoLikeConfig(**src["config"])
    n_train = ds.meta.splits["train"]
    m = build_model(cfg, n_train)
    m.multi_hot = build_multi_hot(cfg.multi_hot, cfg.scale, cfg.locality, cfg.seed, n_train,
                                  int(m.cards.sum()), communities=4, global_share=0.2,
                                  user_pmf=m.users.pmf(0))  # fmt: skip
    m.bias = src["bias"]
    c = generate_chunk(m, n_train, ds.meta.splits["test"])
    want_labels, want = labels_and_probs(m, c)
    assert np.array_equal(want, probs) and np.array_equal(want_labels, labels)
    assert np.array_equal(c.bags[1][0], np.asarray(ds.test.multi_hot[1].values))
    plain = generate_criteo_like(tmp_path / "p", seed=5, multi_hot="2:6", **SMALL)
    assert not np.array_equal(np.load(tmp_path / "p" / "test_true_probs.npy"), probs)
    assert np.array_equal(np.asarray(plain.train.sparse), np.asarray(ds.train.sparse))
    assert cli_main(["dataset", "verify", str(out)]) == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--communities", "4"], "--communities needs --multi-hot"),
        (["--multi-hot", "1:4", "--communities", "5000"], "more than the multi-hot catalogue's"),
        (["--multi-hot", "1:4", "--communities", "4", "--community-global", "2"], "in [0, 1]"),
    ],
)
def test_bad_community_options_are_named(tmp_path: Path, capsys, args, says) -> None:
    rc = cli_main(["generate", "criteo-like", "--out", str(tmp_path / "x"), "--num-samples",
                   "1000", "--scale", "0.002", "--no-progress", *args])  # fmt: skip
    assert rc == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
