"""The whole-step CUDA graph (hetgmp/train/graphed.py) computes what the eager step computes.

- CPU: applying the row update right after backward (``rows_now``, what the graph holds) trains
  bit for bit like applying it at the next forward, for SGD and row-wise Adagrad rows;
- CPU: :func:`graph_support` says why the graph does not apply (device, ranks, optimizer);
- GPU (``-m gpu``): a run with ``--cuda-graphs`` replays graphs and ends where the eager run
  ends (losses, AUC, rows; to float tolerance: atomics order additions differently), and an
  out-of-range id inside a replayed step is still reported, naming the batch.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hetgmp.comm.env import DistEnv
from hetgmp.config import validate
from hetgmp.data.format import open_dataset
from hetgmp.embedding.errors import EmbeddingInputError
from hetgmp.models import build_model
from hetgmp.models.pooling import BagLayout
from hetgmp.train.config import TrainConfig
from hetgmp.train.graphed import GraphedStep, graph_support
from hetgmp.train.run import distributed_embedding, train
from hetgmp.train.runlog import RunLog
from hetgmp.train.trainer import Trainer

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _cfg(ds_root, **kw) -> TrainConfig:
    base = dict(
        dataset=str(ds_root), batch_size=48, embed_dim=4, log_every=3, progress=False,
        lr=0.1, dense_optimizer="adam", dense_lr=0.01, warmup_steps=2, threads=1, epochs=2,
        model="wdl", val=False,
    )  # fmt: skip
    base.update(kw)
    return validate(TrainConfig(**base))


def _trainer(cfg: TrainConfig, env: DistEnv) -> Trainer:
    ds = open_dataset(cfg.dataset)
    torch.manual_seed(cfg.seed)
    meta = ds.meta
    emb = distributed_embedding(cfg, env, meta.num_embeddings, cfg.embed_dim, None)
    model = build_model(
        cfg.model, emb, num_fields=meta.num_fields, num_dense=meta.num_dense,
        embed_dim=cfg.embed_dim,
    )  # fmt: skip
    idx = np.arange(len(ds.train.labels))
    return Trainer(cfg, env, ds, model, RunLog(active=False), indices=idx)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_update_after_backward_equals_update_at_next_forward(tiny_dataset, optimizer) -> None:
    cfg = _cfg(tiny_dataset.root, optimizer=optimizer)
    later, now = _trainer(cfg, DistEnv.single()), _trainer(cfg, DistEnv.single())
    now.train_step.rows_now = True
    later.fit()
    now.fit()
    assert now.model.embedding.local_step.grads is None  # nothing left pending
    for k, v in later.model.dense_state_dict().items():
        torch.testing.assert_close(now.model.dense_state_dict()[k], v, rtol=0, atol=0, msg=k)
    a, b = later.model.embedding.state_dict(), now.model.embedding.state_dict()
    torch.testing.assert_close(a["weight"], b["weight"], rtol=0, atol=0)
    torch.testing.assert_close(a["opt_state"], b["opt_state"], rtol=0, atol=0)


def test_graph_support_says_why_not(tiny_dataset) -> None:
    cfg = _cfg(tiny_dataset.root)
    tr = _trainer(cfg, DistEnv.single())
    step = tr.train_step
    assert tr.run_step is step  # (CPU: eager)
    assert graph_support(tr.env, step, enabled=False, dense_optimizer="adam") == "--no-cuda-graphs"
    assert graph_support(tr.env, step, enabled=True, dense_optimizer="adam") == "device cpu"
    # multi-hot bags (issue 34): the pooled lookup's size is the batch's, so not the whole
    # step (a CUDA env stands in: graph_support only reads settings)
    gpu = DistEnv(device=torch.device("cuda"))
    assert graph_support(gpu, step, enabled=True, dense_optimizer="adam") is None
    step.model.bags = BagLayout(num_single=1, widths=(2,), pooling=("sum",))
    note = graph_support(gpu, step, enabled=True, dense_optimizer="adam")
    assert note is not None and note.startswith("multi-hot bags"), note
    step.model.bags = None
    with pytest.raises(ValueError, match="one-rank"):
        step.model.embedding._one = None  # noqa: SLF001 - stands for a multi-rank table
        GraphedStep(step)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("optimizer", "on_device"), [("sgd", "on"), ("adagrad", "on"), ("adagrad", "off")]
)
def test_graphed_run_matches_eager_run(tiny_dataset, tmp_path, optimizer, on_device) -> None:
    """``on``: resident samples, gathered inside the graph; ``off``: batches copied in."""
    runs = {}
    for graphs in (False, True):
        cfg = _cfg(
            tiny_dataset.root, device="cuda", optimizer=optimizer, cuda_graphs=graphs, val=True,
            log_json=tmp_path / f"log{graphs}.jsonl", checkpoint_dir=tmp_path / f"ck{graphs}",
            data_on_device=on_device,
        )  # fmt: skip
        res = train(cfg, DistEnv.single(device=torch.device("cuda")))
        recs = [json.loads(x) for x in cfg.log_json.read_text().splitlines()]
        runs[graphs] = (res, [r["loss"] for r in recs if r["kind"] == "train"])
    (eager, l_eager), (graphed, l_graphed) = runs[False], runs[True]
    assert eager["graph_replays"] == 0 and graphed["graph_replays"] > 5
    assert graphed["step_graph"] == "whole step"
    np.testing.assert_allclose(l_graphed, l_eager, rtol=1e-4, atol=1e-6)
    assert abs(graphed["val_auc"] - eager["val_auc"]) < 1e-4


@cuda
@pytest.mark.gpu
def test_graphed_step_reports_out_of_range_ids(tiny_dataset) -> None:
    cfg = _cfg(tiny_dataset.root, device="cuda")
    tr = _trainer(cfg, DistEnv.single(device=torch.device("cuda")))
    assert isinstance(tr.run_step, GraphedStep)
    rows = tr.model.embedding.num_rows
    ids = torch.randint(0, rows, (48, 3), device="cuda")
    from hetgmp.data.device_batches import DeviceBatch

    def batch(ids: torch.Tensor) -> DeviceBatch:
        dense = torch.rand(48, 2, device="cuda")
        return DeviceBatch(ids, dense, torch.ones(48, 1, device="cuda"))

    for _ in range(4):
        tr.run_step(batch(ids), 48)
    assert tr.run_step.replays >= 1
    bad = ids.clone()
    bad[5, 1] = rows + 7
    tr.run_step(batch(bad), 48)
    with pytest.raises(EmbeddingInputError, match="earlier batch"):
        tr.model.embedding.flush()


@cuda
@pytest.mark.gpu
def test_graph_gathering_resident_batches_reports_out_of_range_ids(tiny_dataset) -> None:
    """A bad id in the resident samples, gathered inside a replayed graph, is still reported,
    naming its batch (gathered again for the message)."""
    from hetgmp.data.device_batches import EpochPlan, PendingBatch, ResidentSource, step_slots

    cfg = _cfg(tiny_dataset.root, device="cuda")
    tr = _trainer(cfg, DistEnv.single(device=torch.device("cuda")))
    plan = EpochPlan(tr.dataset.train, tr.indices, 48, shuffle=False, seed=0)
    slots = step_slots(plan, step=0, epoch=0, batch=0, steps_per_epoch=6, total_steps=6)
    src = ResidentSource(plan, slots, torch.device("cuda"), ids_int32=True)
    src.deferred = True
    rows = tr.model.embedding.num_rows
    src.sparse[5 * 48 + 3, 1] = rows + 7  # (batch 5 of the unshuffled epoch)
    for _ in range(5):
        _, b = src.next()
        assert isinstance(b, PendingBatch)
        tr.run_step(b, 48)
    assert tr.run_step.replays >= 1 and tr.run_step.source is src
    _, b = src.next()
    tr.run_step(b, 48)
    with pytest.raises(EmbeddingInputError, match=f"earlier batch.*{rows + 7}"):
        tr.model.embedding.flush()
