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


def _step(
    name: str, device: str, amp: bool, graphs: bool, dense: int = DENSE, optimizer: str = "adam"
) -> TrainStep:
    torch.manual_seed(0)
    emb = nn.Embedding(ROWS, model_class(name).table_dim(DIM))
    model = build_model(name, emb, num_fields=FIELDS, num_dense=dense, embed_dim=DIM)
    env = DistEnv.single(device=torch.device(device))
    step = TrainStep(env, model.to(device), optimizer=optimizer, lr=0.01, amp=amp)
    if graphs:
        step.head = GraphedHead(model, step.loss_fn, amp=amp)
    return step


def _batches(device: str, sizes: list[int], dense: bool = True) -> list[DeviceBatch]:
    g = torch.Generator().manual_seed(1)
    out = []
    for b in sizes:
        ids = torch.randint(0, ROWS, (b, FIELDS), generator=g)
        feats = torch.rand(b, DENSE, generator=g)
        labels = (torch.rand(b, 1, generator=g) < 0.3).float()
        x = feats.to(device) if dense else None
        out.append(DeviceBatch(ids.to(device), x, labels.to(device)))
    return out


def _train(
    step: TrainStep, batches: list[DeviceBatch], swap_at: int = -1
) -> list[tuple[torch.Tensor, ...]]:
    """Per step: [loss sum, correct], the row gradient and the dense parameters after it.
    The global batch changes every step (the loss divisor is a graph input); at step
    ``swap_at`` every dense parameter moves to new storage (as flattening them would)."""
    out = []
    emb = step.model.embedding
    for i, batch in enumerate(batches):
        if i == swap_at:
            for p in step.dense_params:
                p.data = p.data.clone()
        emb.weight.grad = None
        res = step(batch, 2 * len(batch) + i)
        flat = torch.cat([p.detach().reshape(-1) for p in step.dense_params])
        out.append((res.detach().clone(), emb.weight.grad.clone(), flat.clone()))
    return out


def _assert_same(want: list, got: list, **tol: float) -> None:
    for i, ((r0, g0, p0), (r1, g1, p1)) in enumerate(zip(want, got, strict=True)):
        torch.testing.assert_close(r1, r0, **tol, msg=f"step {i}: loss")
        torch.testing.assert_close(g1, g0, **tol, msg=f"step {i}: row gradient")
        torch.testing.assert_close(p1, p0, **tol, msg=f"step {i}: dense parameters")


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
    step.head.warmup0 = step.head.warmup = 10**9  # (never captures: eager every step)
    got = _train(step, batches)
    _assert_same(want, got)


def test_head_graph_support() -> None:
    """CUDA, graphs on, and a model split as head(lookup(ids))."""

    class OwnForward(WDL):  # (a user's subclass that overrides forward: no head to capture)
        def forward(self, sparse, dense=None):
            return super().forward(sparse, dense)

    cuda_env = DistEnv.single(device=torch.device("cuda"))
    model = _step("wdl", "cpu", amp=False, graphs=False).model
    own = OwnForward(nn.Embedding(ROWS, DIM), FIELDS, DENSE, DIM)
    assert head_graph_support(cuda_env, model, enabled=True)
    assert not head_graph_support(cuda_env, model, enabled=False)
    assert not head_graph_support(DistEnv.single(), model, enabled=True)
    assert not head_graph_support(cuda_env, own, enabled=True)


def test_shape_follows_batches_until_the_capture() -> None:
    """A partial first batch does not fix the captured shape: the full batches after it warm
    up and replay; a batch of another shape after the capture runs eagerly."""
    step = _step("wdl", "cpu", amp=False, graphs=True)
    head = step.head
    assert head is not None
    part, full, full2, other = _batches("cpu", [5, 16, 16, 9])
    emb = torch.zeros(16, FIELDS, DIM)
    seen = [head._replays(emb[: len(b)], b) for b in (part, full, full, full, full2)]
    assert seen == [False, False, False, True, True]
    head.graph = object()  # (as if captured: the shape is fixed now)
    assert not head._replays(emb[: len(other)], other)
    assert head._replays(emb, full)


@pytest.fixture
def no_tf32():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("amp", [False, True])
@pytest.mark.parametrize("name", MODELS)
def test_replayed_head_equals_eager_step(name: str, amp: bool, no_tf32) -> None:
    """Two warm-up steps, the capture, replays, then a partial batch (eager) and replays."""
    sizes = [64] * 6 + [9] + [64] * 2
    batches = _batches("cuda", sizes)
    ref, step = (_step(name, "cuda", amp, graphs=g) for g in (False, True))
    for s in (ref, step):  # (DCN: the fused Triton cross network, captured with the rest)
        s.model.use_kernels("auto", torch.device("cuda"))
    want, got = _train(ref, batches), _train(step, batches)
    assert step.head is not None and step.head.replays == 6 and step.head.captures == 1
    tol = {"rtol": 2e-2, "atol": 2e-3} if amp else {"rtol": 1e-5, "atol": 1e-6}
    _assert_same(want, got, **tol)


@cuda
@pytest.mark.gpu
def test_replayed_head_without_dense_features_and_moved_parameters(no_tf32) -> None:
    """DLRM without dense features (no bottom MLP: ``dense`` None), SGD on the dense part;
    every parameter moves to new storage after the capture: the graph is captured again."""
    batches = _batches("cuda", [32] * 8, dense=False)
    want = _train(_step("dlrm", "cuda", False, False, dense=0, optimizer="sgd"), batches, 5)
    step = _step("dlrm", "cuda", False, True, dense=0, optimizer="sgd")
    got = _train(step, batches, swap_at=5)
    assert step.head is not None and step.head.captures == 2 and step.head.replays == 6
    _assert_same(want, got, rtol=1e-5, atol=1e-6)


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
