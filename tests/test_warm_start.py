"""``--init-from`` / ``Trainer.init_from`` (issue 32): yesterday's rows, dense weights and
optimizer states carried onto today's data, grown vocabulary included, at another rank count
and with a plan; refused with what differs where shapes do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_vocab_grow import SPEC
from test_vocab_roundtrip import CLI, _csv, _csv_rows

import hetgmp
from hetgmp.cli import main
from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.partition.plan import Plan
from hetgmp.train.checkpoint import CheckpointError, open_checkpoint
from hetgmp.train.warm_start import RowMap, layout_of

MODEL = dict(model="wdl", embed_dim=4, optimizer="adagrad", lr=0.1, seed=3)
LOOP = dict(batch_size=32)


@pytest.fixture(scope="module")
def days(tmp_path_factory) -> Path:
    """Day A (counted vocabulary) and day B (encoded with A's, grown), as CSV preprocessed."""
    d = tmp_path_factory.mktemp("days")
    first = _csv_rows(400, 0, ["news", "shop", "", "sport"])
    second = first[:60] + _csv_rows(300, 1, ["news", "never seen", "other", "", "shop"])
    for name, rows, extra in (("A", first, []), ("B", second, ["--vocab-from", str(d / "A"),
                                                                "--grow-vocab"])):  # fmt: skip
        src = _csv(d / f"{name}.csv", rows)
        assert main(["preprocess", "csv", str(src), *SPEC, "--out", str(d / name),
                     "--test-fraction", "0.2", "--no-progress", *extra]) == 0  # fmt: skip
    ds_a = hetgmp.open_dataset(d / "A")
    tr = hetgmp.Trainer(hetgmp.build_model(ds_a, DistEnv.single(), **MODEL), ds_a,
                        DistEnv.single(), iters=12, verbose=False, evaluate=False, **LOOP)  # fmt: skip
    tr.fit()
    tr.save(d / "ckA")
    return d


def _plan(ds) -> Plan:
    """Random owners and samples on 2 ranks, each mirroring every row it does not own."""
    rng = np.random.default_rng(4)
    dp = rng.integers(0, 2, len(ds.train)).astype(np.int32)
    ep = rng.integers(0, 2, ds.meta.num_embeddings).astype(np.int32)
    mirrors = [np.flatnonzero(ep != w).astype(np.int64) for w in range(2)]
    return Plan(dp, ep, mirrors, {"dataset_fingerprint": ds.fingerprint})


def _expected_rows(
    days: Path, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(found mask, weight, opt_state) the checkpoint of day A holds for day B's ``ids``."""
    ck, ds_b = open_checkpoint(days / "ckA"), hetgmp.open_dataset(days / "B")
    grown = hetgmp.open_dataset(days / "A")
    old = RowMap(layout_of(grown), layout_of(ds_b)).to_old(ids)
    rows = ck.embedding_union()
    pos = {int(i): k for k, i in enumerate(rows["ids"])}
    found = old >= 0
    idx = torch.tensor([pos[int(i)] for i in old[found]], dtype=torch.long)
    return found, rows["weight"][idx], rows["opt_state"][idx]


def _warm_two_ranks(env: DistEnv, days: str) -> float:
    """Day B on 2 ranks with a plan and mirrors, started from the 1-rank checkpoint of day A:
    every stored row (owned and mirrored) must be the checkpoint's; saved as ckB2."""
    ds = hetgmp.open_dataset(Path(days) / "B")
    model = hetgmp.build_model(ds, env, _plan(ds), store_rate=1.0, **MODEL)
    tr = hetgmp.Trainer(model, ds, env, iters=3, verbose=False, evaluate=False, **LOOP)
    tr.init_from(Path(days) / "ckA")
    emb = model.embedding
    assert emb.n_mir > 0
    found, weight, state = _expected_rows(Path(days), emb.stored_ids.cpu())
    assert bool(found.any()) and not bool(found.all())  # (old and new rows on every rank)
    diff = float((emb.weight[found.to(emb.weight.device)].cpu() - weight).abs().max())
    diff = max(diff, float((emb.opt_state[found].cpu() - state).abs().max()))
    tr.save(Path(days) / "ckB2")
    tr.fit()  # (and it trains from there on 2 ranks)
    return diff


def test_init_from_one_rank_onto_two_ranks_with_a_plan_and_a_grown_vocabulary(days) -> None:
    (d0, d1) = spawn_ranks(_warm_two_ranks, 2, str(days), timeout_s=90)
    assert d0 == 0.0 and d1 == 0.0  # owned and mirrored rows are exactly the checkpoint's
    ck_a, ck_b = open_checkpoint(days / "ckA"), open_checkpoint(days / "ckB2")
    # the saved union: old rows as they were, new rows as a fresh table of day B starts
    union = ck_b.embedding_union()
    found, weight, state = _expected_rows(days, union["ids"])
    torch.testing.assert_close(union["weight"][found], weight, rtol=0, atol=0)
    torch.testing.assert_close(union["opt_state"][found], state, rtol=0, atol=0)
    ds_b = hetgmp.open_dataset(days / "B")
    fresh = hetgmp.build_model(ds_b, DistEnv.single(), **MODEL).embedding
    new_ids = union["ids"][~found]
    fresh_w = fresh.weight[torch.argsort(fresh.stored_ids)][new_ids]
    torch.testing.assert_close(union["weight"][~found], fresh_w.cpu(), rtol=0, atol=0)
    # dense weights and Adam's moments carried over
    for k, v in ck_a.dense()["model"].items():
        torch.testing.assert_close(ck_b.dense()["model"][k], v, rtol=0, atol=0)
    sa, sb = ck_a.dense()["optimizer"]["state"], ck_b.dense()["optimizer"]["state"]
    assert sa.keys() == sb.keys() and len(sa) > 0
    for k in sa:
        torch.testing.assert_close(sb[k]["exp_avg"], sa[k]["exp_avg"], rtol=0, atol=0)


def test_init_from_refuses_what_differs(days, tmp_path, capsys) -> None:
    """Another embedding dimension, and data not encoded with the checkpoint's vocabulary, are
    refused by name; no traceback."""
    base = ["train", "--init-from", str(days / "ckA"), "--iter", "2", "--batch-size", "16",
            "--device", "cpu", "--no-progress", "--no-val", "--threads", "1"]  # fmt: skip
    assert main([*base, "--dataset", str(days / "B"), "--embed-dim", "8"]) != 0
    err = capsys.readouterr().err
    assert "embed_dim=4" in err and "embed_dim=8" in err and "Traceback" not in err
    other = _csv(tmp_path / "o.csv", _csv_rows(50, 5, ["x", "y"]))
    assert main(["preprocess", "csv", str(other), *SPEC, "--out", str(tmp_path / "O"),
                 *CLI]) == 0  # fmt: skip
    capsys.readouterr()
    assert main([*base, "--dataset", str(tmp_path / "O"), "--embed-dim", "4"]) != 0
    err = capsys.readouterr().err
    assert str(days / "ckA") in err and "--vocab-from" in err and "Traceback" not in err
    # rows trained with SGD carry no Adagrad state: refused for an Adagrad table
    ds_a, env = hetgmp.open_dataset(days / "A"), DistEnv.single()
    sgd = {**MODEL, "optimizer": "sgd"}
    tr = hetgmp.Trainer(hetgmp.build_model(ds_a, env, **sgd), ds_a, env, iters=1,
                        verbose=False, evaluate=False, **LOOP)  # fmt: skip
    tr.fit()
    tr.save(tmp_path / "sgd")
    tr = hetgmp.Trainer(hetgmp.build_model(ds_a, env, **MODEL), ds_a, env, verbose=False, **LOOP)
    with pytest.raises(CheckpointError, match="--optimizer sgd, whose state does not fit"):
        tr.init_from(tmp_path / "sgd")


def test_cli_init_from_logs_what_it_loaded(days, tmp_path, capsys) -> None:
    """``hetgmp train --init-from``: the log says what came from the checkpoint, training
    starts at step 0 of the new data, and the results record where it started from."""
    out, ck = tmp_path / "res.json", tmp_path / "ck"
    argv = ["train", "--init-from", str(days / "ckA"), "--dataset", str(days / "B"),
            "--batch-size", "16", "--embed-dim", "4", "--seed", "3", "--device", "cpu",
            "--no-progress", "--threads", "1", "--checkpoint-dir", str(ck), "--resume",
            "--output", str(out)]  # fmt: skip
    assert main([*argv, "--iter", "3"]) == 0
    text = capsys.readouterr().out
    assert f"init from {days / 'ckA'}" in text and "new, initialised" in text, text
    import json

    res = json.loads(out.read_text())
    assert res["step"] == 3 and res["config"]["init_from"] == str(days / "ckA")
    # run again (a crashed day-2 run restarted): its own checkpoint wins over --init-from
    assert main([*argv, "--iter", "5"]) == 0
    text = capsys.readouterr().out
    assert "resumed from" in text and "init from" not in text, text
    assert json.loads(out.read_text())["step"] == 5
