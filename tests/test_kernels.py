"""The fused kernels (hetgmp.embedding.kernels) against their torch references: the row
update (scatter_add_rows), the row gather (take_rows) and the one-rank lookup pair
(mark_local + take_local).

On CPU the Triton kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, set before
Triton is first imported, in a subprocess so the rest of the suite is not affected); the same
comparisons run compiled on a GPU when one is present (marker ``gpu``)."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch
from interpreted import compiled, run_interpreted

from hetgmp.embedding.kernels import resolve, scatter_add_rows, scatter_add_rows_reference

pytest.importorskip("triton")

CASES = textwrap.dedent(
    """
    import torch
    from hetgmp.embedding.kernels import (
        gather_rows, mark_local, put_rows, scatter_add_rows, scatter_add_rows_reference,
        take_local, take_rows,
    )

    def check(device):
        g = torch.Generator().manual_seed(0)
        # dims: power of two, not one (masked tail), > the 128-column tile (two tiles)
        # (n: 2, 3 and 9 programs of whole-row tiles, the last one partial)
        for rows, n, d in ((50, 300, 16), (7, 300, 20), (40, 257, 200), (3, 0, 8)):
            table = torch.randn(rows, d, generator=g).to(device)
            # hot rows: ids u^4-distributed, most hits on a few rows; int64 and int32 ids
            for dtype in (torch.int64, torch.int32):
                idx = (torch.rand(n, generator=g) ** 4 * rows).to(dtype).to(device)
                src = torch.randn(n, d, generator=g).to(device)
                want = scatter_add_rows_reference(table.clone(), idx.long(), src, -0.1)
                got = scatter_add_rows(table.clone(), idx, src, -0.1, backend="triton")
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
                # it is an in-place update of the table given
                t = table.clone()
                assert scatter_add_rows(t, idx, src, 1.0, backend="triton") is t
                # an autocast (bf16) gradient is added in float32, both backends
                src16 = src.to(torch.bfloat16)
                want = scatter_add_rows_reference(table.clone(), idx.long(), src16.float(), -0.1)
                for backend in ("torch", "triton"):
                    got = scatter_add_rows(table.clone(), idx, src16, -0.1, backend=backend)
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        # gather_rows: forward = index_select, backward = per-row sums (F.embedding's)
        values = torch.randn(30, 24, generator=g).to(device)
        inv = (torch.rand(500, generator=g) ** 4 * 30).long().to(device)
        up = torch.randn(500, 24, generator=g).to(device)
        want_v = values.clone().requires_grad_()
        torch.nn.functional.embedding(inv, want_v).backward(up)
        got_v = values.clone().requires_grad_()
        out = gather_rows(got_v, inv, "triton")
        torch.testing.assert_close(out, values[inv], rtol=0, atol=0)
        out.backward(up)
        torch.testing.assert_close(got_v.grad, want_v.grad, rtol=1e-5, atol=1e-5)
        print("ok")

    def check_take(device):
        # take_rows == index_select, bit for bit; dims: not a power of two (masked tail), > the
        # 128-column tile (two column tiles); n not a multiple of the row tile; empty
        g = torch.Generator().manual_seed(2)
        for rows, n, d in ((50, 300, 24), (40, 257, 130), (3, 0, 8)):
            table = torch.randn(rows, d, generator=g).to(device)
            for dtype in (torch.int64, torch.int32):
                idx = (torch.rand(n, generator=g) ** 4 * rows).to(dtype).to(device)
                want = table.index_select(0, idx)
                assert torch.equal(take_rows(table, idx, backend="triton"), want)
                out = torch.full((n, d), float("nan"), device=device)
                assert take_rows(table, idx, out=out, backend="triton") is out
                assert torch.equal(out, want)
                # rows leaving in the autocast dtype: converted in the kernel, both backends
                for backend in ("triton", "torch"):
                    half = take_rows(table, idx, backend=backend, out_dtype=torch.bfloat16)
                    assert half.dtype == torch.bfloat16
                    # (within one bf16 step: the interpreter may truncate, not round)
                    torch.testing.assert_close(half.float(), want, rtol=2**-7, atol=0)
            # put_rows == index_copy_ for distinct targets; a repeated target: every element is
            # one of its writers' (on CUDA, not necessarily all from the same row)
            src = torch.randn(n, d, generator=g).to(device)
            dst = torch.randn(rows + n, d, generator=g).to(device)
            distinct = torch.randperm(rows + n, generator=g)[:n].to(device)
            want = dst.clone().index_copy_(0, distinct, src)
            assert torch.equal(put_rows(dst.clone(), distinct, src, backend="triton"), want)
            rep = (torch.rand(n, generator=g) ** 4 * rows).long().to(device)
            got = put_rows(dst.clone(), rep, src, backend="triton")
            for r in rep.unique().tolist():
                assert (got[r][None, :] == src[rep == r]).any(0).all()
            # the Triton kernels skip negative indices (padding)
            skip = torch.where(torch.arange(n, device=device) % 3 == 0, -1, distinct)
            keep = skip >= 0
            got = put_rows(dst.clone(), skip, src, backend="triton")
            assert torch.equal(got, dst.clone().index_copy_(0, skip[keep], src[keep]))
            got = scatter_add_rows(dst.clone(), skip, src, 0.5, backend="triton")
            want = dst.clone().index_add_(0, skip[keep], src[keep], alpha=0.5)
            torch.testing.assert_close(got, want)
        # mark_local + take_local, both backends: two calls on one (stale) pos_map, the first
        # with ids out of range on both sides, then one in range (the flag must be clear again)
        for backend in ("torch", "triton"):
            for rows, n, d in ((300, 1100, 24), (40, 100, 130)):  # (1100: 2 programs of 1024)
                table = torch.randn(rows, d, generator=g).to(device)
                pos_map = torch.randint(-5, n + 5, (rows,), generator=g, dtype=torch.int32)
                pos_map = pos_map.to(device)
                flag = torch.zeros(1, dtype=torch.int32, device=device)
                step = torch.full((1,), 123, dtype=torch.int64, device=device)
                total = torch.zeros(1, dtype=torch.int64, device=device)
                seen = 0
                for bad in (True, False):
                    ids = (torch.rand(n, generator=g) ** 4 * rows).long()
                    if bad:
                        ids[[3, n // 2, n - 1]] = torch.tensor([-1, rows, rows + 7])
                    ids = ids.to(device)
                    slots = mark_local(ids, pos_map, flag, step, rows, backend=backend)
                    assert torch.equal(slots, ids.clamp(0, rows - 1)), backend
                    assert (int(flag) > 0) == bad and int(step) == 0, (backend, flag, step)
                    vals, lead = take_local(
                        table, slots, pos_map, flag, step, total, backend=backend
                    )
                    assert torch.equal(vals, table[slots]) and int(flag) == 0, backend
                    # lead[i]: an occurrence of the same row that leads itself; one per row
                    assert lead.dtype == torch.int32, backend
                    lead = lead.long()
                    assert lead.min() >= 0 and lead.max() < n, backend
                    assert torch.equal(slots[lead], slots) and torch.equal(lead[lead], lead)
                    leaders = slots[lead == torch.arange(n, device=device)]
                    uniq = torch.unique(slots)
                    assert torch.equal(torch.sort(leaders).values, uniq), backend
                    seen += uniq.numel()
                    assert int(step) == uniq.numel() and int(total) == seen, (backend, step, total)
                # rows in the autocast dtype: converted in the kernel, the same leaders
                slots = mark_local(ids, pos_map, flag, step, rows, backend=backend)
                v16, lead16 = take_local(
                    table, slots, pos_map, flag, step, total, backend=backend,
                    out_dtype=torch.bfloat16,
                )
                assert v16.dtype == torch.bfloat16, backend
                # (to bf16's precision: the interpreter may round otherwise than the GPU)
                torch.testing.assert_close(v16.float(), table[slots], rtol=8e-3, atol=1e-6)
                # (leaders: any occurrence may win on CUDA, so equal roles, not equal picks)
                assert torch.equal(slots[lead16.long()], slots), backend
        print("ok")

    def check_trial():
        # the trial launch "auto" runs before picking Triton on a GPU, here in the interpreter
        from hetgmp.embedding.kernels import _trial_launch

        assert _trial_launch(torch.device("cpu")) is None
        # the interpreter always takes Triton's normal launch: nothing was cached
        from hetgmp.embedding.kernels import launcher as K

        assert not K._kernels().compiled and not K._launch_cache

    def check_runtime():
        # the runtime wired to the kernel: same rows as with the torch backend (1 rank, both
        # optimizers; the world-1 path adds every occurrence, so hot rows repeat)
        from hetgmp.comm.env import DistEnv
        from hetgmp.embedding import DistributedEmbedding

        g = torch.Generator().manual_seed(1)
        batches = [(torch.rand(16, 3, generator=g) ** 4 * 40).long() for _ in range(4)]
        for opt in ("sgd", "adagrad"):
            embs = [
                DistributedEmbedding(40, 8, DistEnv.single(), optimizer=opt, lr=0.1, kernels=k)
                for k in ("torch", "triton")
            ]
            assert embs[1].kernels == "triton"
            for t, ids in enumerate(batches):
                for e in embs:  # odd steps: .sum() gives an expanded (stride-0) gradient
                    out = e(ids)
                    (out.sum() if t % 2 else out.pow(2).sum()).backward()
            for e in embs:
                e.flush()
                # Adagrad's row sums: a buffer the update leaves at zero (never refilled)
                gsum = e._one._gsum
                assert (gsum is None) == (opt == "sgd") and (gsum is None or not gsum.any())
            torch.testing.assert_close(embs[1].weight, embs[0].weight, rtol=1e-5, atol=1e-6)
        print("ok")

    def _world2(env):
        # 2 gloo ranks, a plan with mirrors, bound 2: exchange, pushes, refreshes and the
        # backward of the gathered rows all run on each backend (padded: the fixed-capacity
        # exchange, SGD; else the exact one, Adagrad); the four tables one after another in
        # one spawn (starting the ranks costs more than the steps)
        import numpy as np
        from hetgmp.embedding import DistributedEmbedding
        from hetgmp.partition.plan import Plan

        rng = np.random.default_rng(0)
        owner = rng.integers(0, 2, 60).astype(np.int32)
        mirrors = [np.flatnonzero(owner != w).astype(np.int64) for w in range(2)]
        plan = Plan(np.zeros(2, np.int32), owner, mirrors, {})
        out = {}
        for padded in (False, True):
            for kernels in ("torch", "triton"):
                emb = DistributedEmbedding(
                    60, 8, env, plan, store_rate=0.3, bound=2,
                    optimizer="sgd" if padded else "adagrad", lr=0.1, kernels=kernels,
                    replies="all" if padded else "stale",
                    exchange="padded" if padded else "exact",
                )
                g = torch.Generator().manual_seed(env.rank)
                for _ in range(5):
                    ids = (torch.rand(16, 3, generator=g) ** 4 * 60).long()
                    emb(ids).pow(2).sum().backward()
                out[kernels, padded] = emb.state_dict()
        return out

    def check_world2():
        from hetgmp.comm.spawn import spawn_ranks

        for r in spawn_ranks(_world2, 2, timeout_s=240):
            for padded in (False, True):
                a, b = r["torch", padded], r["triton", padded]
                assert torch.equal(a["ids"], b["ids"])
                torch.testing.assert_close(b["weight"], a["weight"], rtol=1e-5, atol=1e-6)
        print("ok")
    """
)


def test_triton_kernel_matches_reference_in_interpreter(tmp_path) -> None:
    calls = ("check('cpu')", "check_take('cpu')", "check_trial()", "check_runtime()",
             "check_world2()")  # fmt: skip
    out = run_interpreted(tmp_path / "kernel_checks.py", CASES, calls=calls, timeout=400)
    assert out == ["ok"] * 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_kernel_matches_reference_on_gpu() -> None:
    ns = compiled(CASES)
    ns["check"]("cuda")
    ns["check_take"]("cuda")


def test_resolve() -> None:
    cpu = torch.device("cpu")
    assert resolve("torch", cpu) == "torch"
    if os.environ.get("TRITON_INTERPRET") != "1":
        assert resolve("auto", cpu) == "torch"  # auto never runs the interpreter
        with pytest.raises(ValueError, match="needs CUDA"):
            resolve("triton", cpu)
    with pytest.raises(ValueError, match="kernels must be one of"):
        resolve("fast", cpu)


def test_torch_backend_is_index_add() -> None:
    t = torch.zeros(4, 3)
    idx = torch.tensor([1, 1, 3])
    src = torch.ones(3, 3)
    scatter_add_rows(t, idx, src, 2.0, backend="torch")
    assert t[1].tolist() == [4.0] * 3 and t[3].tolist() == [2.0] * 3 and t[0].sum() == 0
    assert scatter_add_rows_reference(t, idx[:0], src[:0]) is t  # empty: untouched, no call


# ---------------------------------------------------------------- the cached launcher
class _FakeCompiled:
    """Stands in for Triton's CompiledKernel: records the direct launches."""

    def __init__(self, log: list) -> None:
        self.function, self.packed_metadata, self.log = "fn", "meta", log

    @property
    def run(self):
        return lambda *a: self.log.append(("fast", a))


class _FakeKernel:
    """Stands in for a JITFunction: ``kernel[grid](...)`` logs and returns a compiled kernel
    per specialization (``variants``: how it maps the args to one)."""

    arg_names = ["t", "n", "BLOCK"]
    pre_run_hooks: list = []

    def __init__(self, variants=lambda args: 0) -> None:
        self.log: list = []
        self.variants, self.compiled = variants, {}

    def __getitem__(self, grid):
        def run(*args, **consts):
            self.log.append(("normal", grid, args, consts))
            v = self.variants(args)
            return self.compiled.setdefault(v, _FakeCompiled(self.log))

        return run


def _fake_triton(monkeypatch, compiled: bool = True):
    from types import SimpleNamespace

    from hetgmp.embedding.kernels import launcher as K

    hooks = SimpleNamespace(
        launch_enter_hook=SimpleNamespace(calls=[]), launch_exit_hook=SimpleNamespace(calls=[])
    )
    ns = SimpleNamespace(compiled=compiled, hooks=hooks, triton=SimpleNamespace(__version__="x"))
    monkeypatch.setattr(K, "_kernels", lambda: ns)
    monkeypatch.setattr(K, "_launch_cache", {})
    monkeypatch.setattr(K, "_raw_stream", lambda dev: 77)
    return K, ns


def test_launch_caches_checks_then_launches_directly(monkeypatch) -> None:
    K, _ = _fake_triton(monkeypatch)
    monkeypatch.setattr(K, "VERIFY_EVERY", 3)
    kern = _FakeKernel()
    t = torch.zeros(8)
    for _ in range(7):
        K.launch(kern, (5,), (t, 32), {"BLOCK": 4})
    kinds = [e[0] for e in kern.log]
    # first: compile (normal), second: a check (normal), then VERIFY_EVERY direct launches,
    # then a check again
    assert kinds == ["normal", "normal", "fast", "fast", "fast", "normal", "fast"]
    fast = kern.log[2][1]
    assert fast == (5, 1, 1, 77, "fn", "meta", None, None, None, t, 32, 4)
    # opt-out per call, and the interpreter (not compiled): always the normal path
    K.launch(kern, (5,), (t, 32), {"BLOCK": 4}, fast=False)
    assert kern.log[-1][0] == "normal"


def test_launch_key_separates_specializations(monkeypatch) -> None:
    """Arguments Triton specializes differently (alignment, int divisibility / == 1, dtype)
    get different cache entries; a Triton variant the key did not separate raises."""
    K, _ = _fake_triton(monkeypatch)
    t = torch.zeros(16)
    keys = {K._arg_key(x) for x in (t, t[1:], t.long(), 1, 16, 17, 2**40, 0.5)}
    assert len(keys) == 8
    assert K._arg_key(t[4:]) == K._arg_key(t) and K._arg_key(3) == K._arg_key(5)
    # a kernel whose compiled variant depends on something the key ignores (here n's value)
    kern = _FakeKernel(variants=lambda args: args[1])
    K.launch(kern, (1,), (t, 3), {"BLOCK": 4})
    with pytest.raises(RuntimeError, match="specialization key misses something"):
        K.launch(kern, (1,), (t, 5), {"BLOCK": 4})  # same key, the check sees another kernel


def test_launch_uses_normal_path_with_hooks_or_unusable_kernels(monkeypatch) -> None:
    K, ns = _fake_triton(monkeypatch)
    kern = _FakeKernel()
    t = torch.zeros(4)
    ns.hooks.launch_enter_hook.calls.append(print)  # a profiler's hook: never bypass it
    for _ in range(4):
        K.launch(kern, (1,), (t, 3), {"BLOCK": 4})
    assert [e[0] for e in kern.log] == ["normal"] * 4
    ns.hooks.launch_enter_hook.calls.clear()
    odd = _FakeKernel()
    odd.arg_names = ["t", "n", "X", "BLOCK"]  # parameters launch() cannot place: warned once
    with pytest.warns(UserWarning, match="not a plain compiled kernel"):
        K.launch(odd, (1,), (t, 3), {"BLOCK": 4})
    for _ in range(3):
        K.launch(odd, (1,), (t, 3), {"BLOCK": 4})
    assert [e[0] for e in odd.log] == ["normal"] * 4
    K2, _ = _fake_triton(monkeypatch, compiled=False)  # the interpreter
    interp = _FakeKernel()
    for _ in range(4):
        K2.launch(interp, (1,), (t, 3), {"BLOCK": 4})
    assert [e[0] for e in interp.log] == ["normal"] * 4 and not K2._launch_cache


def test_launch_fills_in_a_defaulted_trailing_constexpr(monkeypatch) -> None:
    """A launch that leaves out a trailing constexpr with a default (prep_key's BY_FIELD
    when not marking by field) still takes the fast path, the default passed in its place."""
    import inspect

    K, _ = _fake_triton(monkeypatch)
    monkeypatch.setattr(K, "_defaults", {})
    kern = _FakeKernel()
    kern.arg_names = ["t", "n", "BLOCK", "FLAG"]

    def sig(t, n, BLOCK, FLAG=False):  # noqa: N803 - the kernel's parameter names
        pass

    kern.signature = inspect.signature(sig)
    t = torch.zeros(4)
    for _ in range(3):
        K.launch(kern, (1,), (t, 3), {"BLOCK": 4})
    assert [e[0] for e in kern.log] == ["normal", "normal", "fast"]
    assert kern.log[0][3] == {"BLOCK": 4, "FLAG": False}
    assert kern.log[2][1][-2:] == (4, False)


def test_adagrad_consume_zeroes_exactly_the_rows_it_used() -> None:
    from hetgmp.embedding.kernels.adagrad import adagrad_rows, adagrad_rows_reference

    g = torch.Generator().manual_seed(3)
    weight, state = torch.randn(10, 4, generator=g), torch.rand(10, generator=g)
    idx = torch.tensor([3, 5, 3, 7, 5])
    lead = torch.tensor([0, 1, 0, 3, 1], dtype=torch.int32)  # leaders: entries 0, 1, 3
    grad = torch.randn(5, 4, generator=g)
    want_w, want_s = weight.clone(), state.clone()
    adagrad_rows_reference(want_w, want_s, idx, grad.clone(), 0.1, 1e-7, lead=lead)
    used = grad.clone()
    adagrad_rows(weight, state, idx, used, 0.1, 1e-7, lead=lead, consume=True)
    assert torch.equal(weight, want_w) and torch.equal(state, want_s)
    assert not used[[0, 1, 3]].any() and torch.equal(used[[2, 4]], grad[[2, 4]])
    with pytest.raises(ValueError, match="float32 contiguous"):
        adagrad_rows(weight, state, idx, grad.t().contiguous().t(), 0.1, 1e-7, consume=True)
    # versions: each leader's row moves by its entry's count, which is zeroed; others untouched
    ver, cnt = torch.zeros(10, dtype=torch.int64), torch.tensor([4, 2, 9, 1, 9])
    adagrad_rows(weight, state, idx, grad.clone(), 0.1, 1e-7, lead=lead, versions=(ver, cnt))
    assert ver.tolist() == [0, 0, 0, 4, 0, 2, 0, 1, 0, 0]
    assert cnt.tolist() == [0, 0, 9, 0, 9]
