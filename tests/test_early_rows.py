"""The first layer's last rows summed over ranks early (``hetgmp.train.dense_sync.EARLY_ROWS``,
off until measured; issue 30): the deferred weight product of those rows runs first and their
all-reduce starts from inside backward, the rest of the bucket is summed after it. On 2 gloo
ranks the run trains as without it (rows, optimizer state, dense layers; the split products
add in another order, so to float tolerance), and the early start happened every step."""

from __future__ import annotations

import pytest
import torch
from test_whole_step_multi import _cfg, _plan, _rank
from torch import nn

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.models import deferred_wgrad
from hetgmp.train import dense_sync
from hetgmp.train.config import TrainConfig


def _run(env: DistEnv, cfg: TrainConfig, early: bool, whole: bool = False) -> dict:
    dense_sync.EARLY_ROWS = early  # (in the spawned rank)
    started, real = [0], _REAL_START

    def counted(self, weight, r0, r1) -> None:  # type: ignore[no-untyped-def]
        real(self, weight, r0, r1)
        started[0] += int(self._early is not None)

    dense_sync.GradBucket.start_early = counted  # type: ignore[method-assign]
    out = _rank(env, cfg, whole, None)
    out["started"] = started[0]
    return out


_REAL_START = dense_sync.GradBucket.start_early


def test_early_rows_train_as_one_all_reduce(tiny_dataset, tmp_path) -> None:
    plan = _plan(tiny_dataset, 2, tmp_path / "part.npz")
    cfg = _cfg(tiny_dataset.root, plan, optimizer="adagrad", bound=3, dense_optimizer="adam",
               dense_lr=0.01)  # fmt: skip
    off = spawn_ranks(_run, 2, cfg, False, timeout_s=180)
    on = spawn_ranks(_run, 2, cfg, True, timeout_s=180)
    steps = on[0]["res"]["step"]
    for a, b in zip(off, on, strict=True):
        assert a["started"] == 0 and b["started"] == steps > 4, (a["started"], b["started"])
        torch.testing.assert_close(b["weight"], a["weight"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b["opt"], a["opt"], rtol=1e-5, atol=1e-6)
        for k, v in a["dense"].items():
            torch.testing.assert_close(b["dense"][k], v, rtol=1e-5, atol=1e-6, msg=k)
    # (and the ranks agree: the early rows were summed, not left local)
    for k, v in on[0]["dense"].items():
        torch.testing.assert_close(on[1]["dense"][k], v, rtol=0, atol=0, msg=k)


def test_the_split_product_equals_the_whole_one() -> None:
    """The deferred product in three parts (the first weight's last rows, handed to the hook,
    then its other rows, then the other weights') adds what the one product adds."""
    torch.manual_seed(0)
    first, wide = nn.Linear(12, 6), nn.Linear(12, 1)
    x, up = torch.randn(5, 12, requires_grad=True), torch.randn(5, 8)
    grads = []
    for hooked in (False, True):
        seen: list = []

        def hook(w, r0, r1, seen=seen) -> None:  # type: ignore[no-untyped-def]
            seen.append((r0, r1, w.grad[r0:r1].clone()))

        deferred_wgrad.set_rows_hook(first, hook if hooked else None)
        for lin in (first, wide):
            lin.weight.grad = torch.zeros_like(lin.weight)
        w = torch.cat([first.weight, wide.weight, torch.zeros(1, 12)]).detach()
        (deferred_wgrad.first_product(x, w, (first, wide), 12) * up).sum().backward()
        grads.append((first.weight.grad.clone(), wide.weight.grad.clone(), seen))
    (f0, w0, s0), (f1, w1, s1) = grads
    torch.testing.assert_close(f1, f0, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w1, w0, rtol=1e-6, atol=1e-6)
    assert s0 == [] and [(r0, r1) for r0, r1, _ in s1] == [(3, 6)]
    torch.testing.assert_close(s1[0][2], f0[3:6], rtol=1e-6, atol=1e-6)  # (final when handed)


def _whole_interpreted(env: DistEnv, cfg: TrainConfig) -> tuple[dict, dict]:
    from test_whole_step_multi import interpreter_now

    interpreter_now()
    return _run(env, cfg, False, True), _run(env, cfg, True, True)


@pytest.mark.slow  # (~15 s in Triton's interpreter; the GPU check is the one that captures it)
def test_early_rows_in_the_whole_step_flow(tiny_dataset, tmp_path) -> None:
    """The same in the multi-rank whole-step flow (the fused segments in Triton's interpreter):
    the hook fires inside its step, and the run trains as with one all-reduce."""
    pytest.importorskip("triton")
    from test_whole_step_multi import interpreted_runs

    runs = interpreted_runs(tiny_dataset, tmp_path, _whole_interpreted)
    for off, on in runs:
        assert off["started"] == 0 and on["started"] >= 4, (off["started"], on["started"])
        torch.testing.assert_close(on["weight"], off["weight"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(on["opt"], off["opt"], rtol=1e-5, atol=1e-6)
        for k, v in off["dense"].items():
            torch.testing.assert_close(on["dense"][k], v, rtol=1e-5, atol=1e-6, msg=k)
