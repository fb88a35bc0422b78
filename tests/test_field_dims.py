"""A dimension per field (``--embed-dim 4,2,3,4``, issue 34): the table keeps the largest
width, each field uses its first d_f columns. The models take the concatenation (WDL, DCN,
DeepFM's deep part), DeepFM's FM pairs fields over their common columns, DLRM projects the
narrower fields; the unused columns get no gradient, so they keep their initial values; a run
whose dimensions are all equal is the one-number run bit for bit; a per-field run trains; the
rows and bytes exchanged between two real gloo ranks are those of the full-width run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_python_api import _same_checkpoints
from test_train_multi_hot import _data
from torch import nn

import hetgmp
from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.config import ConfigError, add_arguments, from_namespace, validate
from hetgmp.embedding.init import initial_rows
from hetgmp.models import MODELS, build_model, model_class
from hetgmp.serve.export import export_checkpoint
from hetgmp.train.checkpoint import CheckpointError, open_checkpoint
from hetgmp.train.config import TrainConfig
from hetgmp.train.run import train

DIMS = (4, 2, 3, 4)  # fields a, b (single-hot), h1, h2 (multi-hot) of test_train_multi_hot's data
RUN = dict(
    batch_size=32, log_every=1, warmup_steps=0, seed=3, lr=0.1, progress=False, threads=1,
    dense_optimizer="sgd", dense_lr=0.05,
)  # fmt: skip


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_read_only_each_fields_columns(name: str) -> None:
    """Rows of field f get gradient in their first d_f columns only (and DeepFM's first-order
    column); WDL/DCN/DeepFM's deep input is sum(d_f) wide; DLRM projects the narrow fields."""
    torch.manual_seed(0)
    dims, rows = (8, 3, 5, 8, 1), 10  # field f's ids: f*10 .. f*10+9
    emb = nn.Embedding(50, model_class(name).table_dim(8))
    model = build_model(name, emb, num_fields=5, num_dense=2, embed_dim=8, field_dims=dims)
    sparse = torch.randint(0, rows, (16, 5)) + torch.arange(5) * rows
    model(sparse, torch.rand(16, 2)).sum().backward()
    grad = emb.weight.grad
    for f, d in enumerate(dims):
        block = grad[f * rows : (f + 1) * rows]
        assert block[:, :d].abs().sum() > 0, (name, f)
        assert torch.equal(block[:, d:8], torch.zeros_like(block[:, d:8])), (name, f)
    if name in ("wdl", "dcn", "dfm"):
        assert model.deep.first.in_features == sum(dims) + 2
    if name == "dlrm":
        assert [lin.in_features for lin in model.project.maps] == [3, 5, 1]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_equal_dims_are_the_plain_model(name: str) -> None:
    """Every field at the table's width: the same parameters and outputs as no list at all."""
    out = []
    for dims in (None, (6,) * 4):
        torch.manual_seed(1)
        emb = nn.Embedding(20, model_class(name).table_dim(6))
        model = build_model(name, emb, num_fields=4, num_dense=1, embed_dim=6, field_dims=dims)
        out.append((model.dense_state_dict(), model(torch.arange(8).view(2, 4), torch.ones(2, 1))))
    assert out[0][0].keys() == out[1][0].keys()
    assert torch.equal(out[0][1], out[1][1])


def test_deepfm_fm_pairs_fields_over_their_common_columns() -> None:
    torch.manual_seed(0)
    emb = nn.Embedding(3, 5)  # embed_dim 4 + first-order column
    model = build_model("dfm", emb, num_fields=3, num_dense=0, embed_dim=4, field_dims=(4, 2, 1))
    v = emb.weight[:, :4].detach()
    want = v[0, :2] @ v[1, :2] + v[0, :1] @ v[2, :1] + v[1, :1] @ v[2, :1]
    rows = emb(torch.arange(3).view(1, 3))
    vec = model.fields.masked(rows[..., :4])
    fm = 0.5 * (vec.sum(1).pow(2) - vec.pow(2).sum(1)).sum()
    assert fm.item() == pytest.approx(want.item(), rel=1e-5)


def _losses(log: Path) -> list[float]:
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def test_per_field_run_trains_and_leaves_unused_columns_alone(tmp_path: Path) -> None:
    ds = _data(tmp_path / "d")
    cfg = TrainConfig(
        dataset=str(ds.root), epochs=3, embed_dim=DIMS, checkpoint_dir=tmp_path / "ck",
        log_json=tmp_path / "log.jsonl", **RUN,
    )  # fmt: skip
    res = train(validate(cfg), DistEnv.single("cpu"))
    losses = _losses(tmp_path / "log.jsonl")
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.1 and res["val_auc"] > 0.75
    ck = open_checkpoint(tmp_path / "ck")
    assert ck.manifest["field_dims"] == list(DIMS) and ck.manifest["embed_dim"] == 4
    rows = ck.embedding_union()
    init = initial_rows(rows["ids"], 4, seed=3, scale=cfg.init_scale)
    meta = ds.meta
    for f, d in zip([*meta.fields, *meta.multi_hot], DIMS, strict=True):
        mine = (rows["ids"] >= f.offset) & (rows["ids"] < f.offset + f.cardinality)
        assert mine.sum() > 0
        # the used columns trained, the unused ones are exactly their initial values
        assert not torch.equal(rows["weight"][mine, :d], init[mine, :d])
        assert torch.equal(rows["weight"][mine, d:], init[mine, d:]), f.name
    # export serves it (tests/test_serve_field_dims.py scores it): version 3, the dims recorded
    art = json.loads((export_checkpoint(tmp_path / "ck", tmp_path / "art") / "manifest.json")
                     .read_text())  # fmt: skip
    assert (art["version"], art["field_dims"], art["num_fields"]) == (3, list(DIMS), 2)


def test_equal_dims_run_is_the_one_number_run(tmp_path: Path) -> None:
    ds = _data(tmp_path / "d")
    for tag, dim in (("one", 3), ("list", "3,3,3,3")):
        cfg = TrainConfig(
            dataset=str(ds.root), epochs=2, embed_dim=dim, checkpoint_dir=tmp_path / tag,
            log_json=tmp_path / f"{tag}.jsonl", **RUN,
        )  # fmt: skip
        train(validate(cfg), DistEnv.single("cpu"))
    one, many = _losses(tmp_path / "one.jsonl"), _losses(tmp_path / "list.jsonl")
    assert len(one) > 10 and one == many
    _same_checkpoints(tmp_path / "one", tmp_path / "list")  # rows, dense, optimizer states
    # equal dimensions export as the one-number model: version 2 (bags), no field_dims
    art = json.loads((export_checkpoint(tmp_path / "list", tmp_path / "art") / "manifest.json")
                     .read_text())  # fmt: skip
    assert art["version"] == 2 and "field_dims" not in art


def test_wrong_count_and_bad_values_are_refused_clearly(tmp_path: Path) -> None:
    ds = _data(tmp_path / "d")
    cfg = validate(TrainConfig(dataset=str(ds.root), embed_dim=(4, 2), **RUN))
    with pytest.raises(ConfigError, match=r"lists 2 dimensions .* 4 fields \(a, b, h1, h2"):
        train(cfg, DistEnv.single("cpu"))
    with pytest.raises(ConfigError, match="embed_dim: 'x,3' is not a dimension"):
        TrainConfig(embed_dim="x,3")
    with pytest.raises(ConfigError, match=r">= 1, got \[4, 0\]"):
        TrainConfig(embed_dim=(4, 0))
    with pytest.raises(ConfigError, match="lists 3 dimensions"):  # (the Python API: a tuple)
        hetgmp.build_model(ds, DistEnv.single("cpu"), embed_dim=(4, 2, 3))
    model = hetgmp.build_model(ds, DistEnv.single("cpu"), embed_dim="4,2,3,4")
    assert model.fields.dims == DIMS and model.embed_dim == 4


def test_cli_parses_one_number_or_a_list() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser, TrainConfig)
    cfg = from_namespace(TrainConfig, parser.parse_args(["--embed-dim", "16,8,4"]))
    assert (cfg.embed_dim, cfg.field_dims) == (16, (16, 8, 4))
    cfg = from_namespace(TrainConfig, parser.parse_args(["--embed_dim", "8"]))
    assert (cfg.embed_dim, cfg.field_dims) == (8, None)
    with pytest.raises(SystemExit):
        parser.parse_args(["--embed-dim", "8,y"])
    cfg = from_namespace(
        TrainConfig, parser.parse_args(["--embed-dim", "8", "--field-dims", "8,4"])
    )
    assert (cfg.embed_dim, cfg.field_dims) == (8, (8, 4))  # (as a saved config gives them)


def test_saved_config_loads_back(tmp_path: Path) -> None:
    """A run's results file holds embed_dim (the largest) and field_dims: --config takes it;
    a different --embed-dim beside it is refused, not silently replaced."""
    from hetgmp.cli import build_parser

    ds = _data(tmp_path / "d")
    cfg = TrainConfig(dataset=str(ds.root), iter=2, embed_dim=DIMS, val=False,
                      output=tmp_path / "res.json", **RUN)  # fmt: skip
    train(validate(cfg), DistEnv.single("cpu"))
    parser = build_parser()
    ns = parser.parse_args(["train", "--config", str(tmp_path / "res.json")])
    again = from_namespace(TrainConfig, ns)
    assert (again.embed_dim, again.field_dims) == (4, DIMS)
    ns = parser.parse_args(["train", "--config", str(tmp_path / "res.json"), "--embed-dim", "8"])
    with pytest.raises(ConfigError, match="8 is not the largest of the per-field"):
        from_namespace(TrainConfig, ns)
    (tmp_path / "hand.yaml").write_text("embed_dim: [4, 2, 3, 4]\n")
    ns = parser.parse_args(["train", "--config", str(tmp_path / "hand.yaml")])
    assert from_namespace(TrainConfig, ns).field_dims == DIMS


def _counters(env: DistEnv, root: str, dim: object) -> dict:
    torch.set_num_threads(1)
    cfg = TrainConfig(dataset=root, iter=8, embed_dim=dim, store_rate=0.3, val=False, **RUN)
    return train(validate(cfg), env)["embedding_train_counters"]


def test_two_ranks_exchange_the_full_width_rows(tmp_path: Path) -> None:
    """Per-field dimensions move the same rows, the same bytes, as the full-width run: the
    exchange's rows are the table's (4 wide), whatever columns a field reads."""
    ds = _data(tmp_path / "d")
    per_field = spawn_ranks(_counters, 2, str(ds.root), DIMS, timeout_s=120)[0]
    full = spawn_ranks(_counters, 2, str(ds.root), 4, timeout_s=120)[0]
    assert per_field["rows_remote"] > 0 and per_field["bytes_sent_values"] > 0
    assert per_field == full


def test_resume_needs_the_same_dimensions(tmp_path: Path) -> None:
    ds = _data(tmp_path / "d")
    base = dict(dataset=str(ds.root), iter=2, val=False, checkpoint_dir=tmp_path / "ck", **RUN)
    train(validate(TrainConfig(embed_dim=DIMS, **base)), DistEnv.single("cpu"))
    again = TrainConfig(embed_dim=(4, 2, 2, 4), resume=True, **{**base, "iter": 4})
    with pytest.raises(CheckpointError, match=r"made for field_dims=\[4, 2, 3, 4\], this run"):
        train(validate(again), DistEnv.single("cpu"))


def test_api_per_field_model_trains_as_the_cli(tmp_path: Path) -> None:
    """build_model(embed_dim=(...)) + Trainer.fit: the CLI's run with --embed-dim 4,2,3,4."""
    torch.set_num_threads(1)
    ds = _data(tmp_path / "d")
    loop = dict(batch_size=32, dense_optimizer="sgd", dense_lr=0.05, log_every=1, warmup_steps=0)
    cfg = TrainConfig(dataset=str(ds.root), iter=10, embed_dim="4,2,3,4", progress=False,
                      threads=1, seed=3, lr=0.1, checkpoint_dir=tmp_path / "cli", **loop)  # fmt: skip
    train(validate(cfg), DistEnv.single("cpu"))
    model = hetgmp.build_model(ds, DistEnv.single("cpu"), embed_dim=DIMS, seed=3, lr=0.1)
    trainer = hetgmp.Trainer(model, ds, DistEnv.single("cpu"), iters=10, verbose=False,
                             checkpoint_dir=tmp_path / "api", **loop)  # fmt: skip
    trainer.fit()
    trainer.close()
    _same_checkpoints(tmp_path / "cli", tmp_path / "api")
    assert open_checkpoint(tmp_path / "api").manifest["field_dims"] == list(DIMS)
