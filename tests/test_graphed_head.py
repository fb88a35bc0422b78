"""The dense part of a step as a CUDA graph (hetgmp/train/graphed_head.py) computes what the
eager step computes.

- CPU: every model's ``forward`` is ``head(lookup(ids))``; :class:`GraphedHead`'s eager path
  (warm-up, other shapes) gives the eager step's logits, loss and gradients, dense and rows;
- GPU (``-m gpu``): replayed steps give the eager step's losses, dense gradients and row
  gradients, step by step, for every model, with and without AMP, a last partial batch
  included; a 2-rank run (lockstep and ``--sync async``, one GPU over gloo) replays the dense
  part and ends with the checkpoint of the run without graphs.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.data.device_batches import DeviceBatch
from hetgmp.models import build_model, model_class
from hetgmp.models.ctr import WDL
from hetgmp.train.graphed_head import GraphedHead, head_graph_support
from hetgmp.train.step import TrainStep

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
MODELS = ["wdl", "dcn", "dfm", "dlrm"]
ROWS, FIELDS, DENSE, DIM = 500, 5, 3, 4


def _step(name: str, device: str, amp: bool, graphs: bool) -> TrainStep:
    torch.manual_seed(0)
    emb = nn.Embedding(ROWS, model_class(name).table_dim(DIM))
    model = build_model(name, emb, num_fields=FIELDS, num_dense=DENSE, embed_dim=DIM)
    env = DistEnv.single(device=torch.device(device))
    step = TrainStep(env, model.to(device), optimizer="adam", lr=0.01, amp=amp)
    if graphs:
        step.head = GraphedHead(model, step.loss_fn, amp=amp)
    return step


def _batches(device: str, sizes: list[int]) -> list[DeviceBatch]:
    g = torch.Generator().manual_seed(1)
    out = []
    for b in sizes:
        ids = torch.randint(0, ROWS, (b, FIELDS), generator=g)
        dense = torch.rand(b, DENSE, generator=g)
        labels = (torch.rand(b, 1, generator=g) < 0.3).float()
        out.append(DeviceBatch(ids.to(device), dense.to(device), labels.to(device)))
    return out


def _train(step: TrainStep, batches: list[DeviceBatch]) -> list[tuple[torch.Tensor, ...]]:
    """Per step: [loss sum, correct], the row gradient and the dense parameters after it."""
    out = []
    emb = step.model.embedding
    for batch in batches:
        emb.weight.grad = None
        res = step(batch, 2 * len(batch))
        flat = torch.cat([p.detach().reshape(-1) for p in step.dense_params])
        out.append((res.detach().clone(), emb.weight.grad.clone(), flat.clone()))
    return out


@pytest.mark.parametrize("name", MODELS)
def test_forward_is_head_of_lookup(name: str) -> None:
    step = _step(name, "cpu", amp=False, graphs=False)
    (batch,) = _batches("cpu", [7])
    model = step.model
    want = model(batch.sparse, batch.dense)
    torch.testing.assert_close(model.head(model.lookup(batch.sparse), batch.dense), want)


@pytest.mark.parametrize("name", MODELS)
def test_eager_path_of_graphed_head_equals_eager_step(name: str) -> None:
    """On the CPU (no capture) the head runs eagerly: the same numbers as TrainStep alone."""
    batches = _batches("cpu", [16, 16, 16, 5])
    want = _train(_step(name, "cpu", amp=False, graphs=False), batches)
    step = _step(name, "cpu", amp=False, graphs=True)
    assert step.head is not None
    step.head.warmup = 10**9  # (never captures: the eager fallback every step)
    got = _train(step, batches)
    for (r0, g0, p0), (r1, g1, p1) in zip(want, got, strict=True):
        torch.testing.assert_close(r1, r0)
        torch.testing.assert_close(g1, g0)
        torch.testing.assert_close(p1, p0)


def test_head_graph_support() -> None:
    """CUDA, graphs on, not the whole step, and a model split as head(lookup(ids))."""

    class OwnForward(WDL):  # (a user's subclass that overrides forward: no head to capture)
        def forward(self, sparse, dense=None):
            return super().forward(sparse, dense)

    cuda_env = DistEnv.single(device=torch.device("cuda"))
    model = _step("wdl", "cpu", amp=False, graphs=False).model
    own = OwnForward(nn.Embedding(ROWS, DIM), FIELDS, DENSE, DIM)
    assert head_graph_support(cuda_env, model, enabled=True, whole_step=False)
    assert not head_graph_support(cuda_env, model, enabled=False, whole_step=False)
    assert not head_graph_support(cuda_env, model, enabled=True, whole_step=True)
    assert not head_graph_support(DistEnv.single(), model, enabled=True, whole_step=False)
    assert not head_graph_support(cuda_env, own, enabled=True, whole_step=False)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("amp", [False, True])
@pytest.mark.parametrize("name", MODELS)
def test_replayed_head_equals_eager_step(name: str, amp: bool) -> None:
    """Two warm-up steps, the capture, replays, then a partial batch (eager) and replays."""
    torch.backends.cuda.matmul.allow_tf32 = False
    sizes = [64] * 6 + [9] + [64] * 2
    batches = _batches("cuda", sizes)
    want = _train(_step(name, "cuda", amp, graphs=False), batches)
    step = _step(name, "cuda", amp, graphs=True)
    got = _train(step, batches)
    assert step.head is not None and step.head.replays == 6
    tol = {"rtol": 2e-2, "atol": 2e-3} if amp else {"rtol": 1e-4, "atol": 1e-5}
    for i, ((r0, g0, p0), (r1, g1, p1)) in enumerate(zip(want, got, strict=True)):
        torch.testing.assert_close(r1, r0, **tol, msg=f"step {i}: loss")
        torch.testing.assert_close(g1, g0, **tol, msg=f"step {i}: row gradient")
        torch.testing.assert_close(p1, p0, **tol, msg=f"step {i}: dense parameters")


def _train_rank_on_gpu(env: DistEnv, cfg) -> dict:
    import dataclasses

    from hetgmp.train.run import train

    torch.cuda.set_device(0)
    return train(cfg, dataclasses.replace(env, device=torch.device("cuda", 0)))


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("sync", ["collective", "async"])
def test_two_rank_run_with_graphed_head_ends_as_eager_run(tiny_dataset, tmp_path, sync) -> None:
    pytest.importorskip("zmq")
    from test_train_dist import _cfg, _ckpt_state, _uneven_plan

    plan = _uneven_plan(tiny_dataset, 2, tmp_path / "part.npz")
    states, res = {}, {}
    for graphs in (False, True):
        extra = {"async_host": "127.0.0.1"} if sync == "async" else {}
        cfg = _cfg(
            tiny_dataset.root, model="wdl", iter=8, partition=plan, store_rate=0.5, bound=0,
            optimizer="sgd", checkpoint_dir=tmp_path / f"{sync}{graphs}", sync=sync,
            device="cuda", backend="gloo", amp=False, matmul_precision="highest",
            cuda_graphs=graphs, **extra,
        )  # fmt: skip
        res[graphs] = spawn_ranks(
            _train_rank_on_gpu, 2, cfg, timeout_s=300, collective_timeout_s=120
        )
        states[graphs] = _ckpt_state(tmp_path / f"{sync}{graphs}")
    assert res[True][0]["step_graph"].startswith("dense part"), res[True][0]["step_graph"]
    assert res[True][0]["graph_replays"] > 0 and res[False][0]["graph_replays"] == 0
    (d0, w0, i0), (d1, w1, i1) = states[False], states[True]
    assert torch.equal(i0, i1)
    torch.testing.assert_close(w1, w0, rtol=1e-5, atol=1e-5)
    for k in d0:
        torch.testing.assert_close(d1[k].cpu(), d0[k].cpu(), rtol=1e-5, atol=1e-5, msg=k)
