"""A new batch size must not compile a Triton kernel again.

Triton specializes a kernel on each int argument that is not marked ``do_not_specialize``: on
its being 1 and on its divisibility by 16 (part of the compiled kernel's cache key). The first
partial batch of an epoch (2,483 samples instead of 8192) therefore compiled every kernel that
takes a batch size again: a ~5 s stall on 2 H100s (``examples/hetuctr.py``, issue 30). Here, on
CPU, every ``@triton.jit`` kernel of hetgmp is found in the source, each of its runtime
arguments must be classified below, and Triton's own binder (what ``JITFunction.run`` computes
the cache key from) must give one specialization for any batch size, while the arguments fixed
for a run (strides, widths, capacities) keep theirs. ``bench/gpu/recompile_check.py`` shows the
same on a GPU, with the compile times.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.compiler import BaseBackend  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# Runtime (non-constexpr, non-pointer) arguments of the launched kernels, by what they are.
# Change with the batch (sizes, counts, programs over the batch; the epoch scan's batch offset,
# samples, stamp and output row): never specialized.
BATCH = {
    "n",
    "u",
    "o",
    "e0",
    "P",
    "B",
    "rows_per_group",
    "b_rows",
    "b0",
    "s",
    "stamp",
    "out_row",
    "start",
    "S",
}
# Fixed for a run (a table's counts, capacities that are multiples of 256, payload strides and
# offsets, tensor strides and widths, settings; the device tier's cache rows and miss entries;
# F, K: a multi-hot model's single-hot and bag
# fields): specialized, aligned address arithmetic.
FIXED = {
    "num_rows", "n_own", "n_mir", "trash", "bound", "rank", "room_p", "q", "p", "s1", "s2",
    "s1h", "q2", "g0", "Ka", "Kb", "stride_a", "stride_b", "stride_ga", "stride_gb", "stride_w",
    "n_params", "F", "K", "cache_rows", "capacity", "skip",
}  # fmt: skip
FLOATS = {"alpha", "lr", "eps", "neg_lr", "b1", "b2"}  # (Triton never specializes floats)
# A full batch of the user's command (8192 x 26 ids), partial ones, a tiny one.
SIZES = (8192 * 26, 2483 * 26, 64560, 17, 1)


def _jit_functions() -> dict[str, Any]:
    """Every ``@triton.jit`` function of hetgmp (``module:name`` -> the object), found through
    the source files that use the decorator."""
    found = {}
    for path in sorted((ROOT / "hetgmp").rglob("*.py")):
        if "@triton.jit" not in path.read_text():
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mod = importlib.import_module(name)
        for attr, obj in vars(mod).items():
            if isinstance(obj, JITFunction | InterpretedFunction) and obj.fn.__module__ == name:
                found[f"{name}:{attr}"] = obj
    return found


def _compiled(obj: Any) -> JITFunction:
    """The ``JITFunction`` of ``obj`` (under ``TRITON_INTERPRET=1`` the decorator made an
    ``InterpretedFunction``: the same function with the declared options)."""
    if isinstance(obj, JITFunction):
        return obj
    opts = ("do_not_specialize", "do_not_specialize_on_alignment")
    return JITFunction(obj.fn, **{k: obj.kwargs.get(k) for k in opts})


FUNCTIONS = _jit_functions()
KERNELS = {k: _compiled(v) for k, v in FUNCTIONS.items() if k.endswith("_kernel")}


def _runtime_params(kernel: JITFunction) -> list[Any]:
    return [p for p in kernel.params if not p.is_constexpr and not p.name.endswith("_ptr")]


def _specialization(kernel: JITFunction, batch: int, fixed: int) -> list[Any]:
    """What Triton keys the compiled kernel on, for pointers to aligned tensors, every batch
    argument ``batch`` and every fixed int ``fixed``."""
    bind = create_function_from_signature(kernel.signature, kernel.params, BaseBackend)
    t = torch.zeros(8)
    args = []
    for p in kernel.params:
        if p.is_constexpr:
            args.append(16)
        elif p.name.endswith("_ptr"):
            args.append(t)
        else:
            args.append(0.5 if p.name in FLOATS else batch if p.name in BATCH else fixed)
    return bind(*args)[1]


def test_every_kernel_found_and_every_argument_classified() -> None:
    # (the modules the issue names, and more if any appear)
    mods = {k.split(":")[0].rsplit(".", 1)[1] for k in KERNELS}
    assert {"rows_triton", "prep_triton", "kernels_triton", "owner_triton", "presync_triton",
            "cross_triton", "adam_triton", "pooling_triton"} <= mods  # fmt: skip
    srcs = {k: inspect.getsource(v.fn) for k, v in FUNCTIONS.items()}
    for key in FUNCTIONS:
        if key in KERNELS:
            continue  # a function not named *_kernel must be a device function: called in one
        name = key.split(":")[1]  # (or a scan's combine function, passed by name)
        used = (f"{name}(", f"{name})")
        assert any(u in s for k, s in srcs.items() if k != key for u in used), (
            f"{key} is not called by another jit function: a launched kernel must be named "
            "*_kernel, so that this test checks its arguments"
        )
    for key, kernel in KERNELS.items():
        for p in _runtime_params(kernel):
            assert p.name in BATCH | FIXED | FLOATS, (
                f"{key}: argument {p.name!r} is not classified in {__file__}: does it change "
                "with the batch (BATCH: mark it do_not_specialize) or not (FIXED)?"
            )
            assert p.do_not_specialize == (p.name in BATCH), (key, p.name)


@pytest.mark.parametrize("key", sorted(KERNELS))
def test_one_compiled_variant_for_every_batch_size(key: str) -> None:
    kernel = KERNELS[key]
    specs = [_specialization(kernel, n, 256) for n in SIZES]
    assert all(s == specs[0] for s in specs), (key, specs)


@pytest.mark.parametrize("key", sorted(KERNELS))
def test_fixed_arguments_keep_their_alignment(key: str) -> None:
    kernel = KERNELS[key]
    if not any(p.name in FIXED for p in _runtime_params(kernel)):
        pytest.skip("no fixed int argument")
    # (a multiple of 16 and an odd value: Triton tells them apart, so the aligned one keeps
    # its vector accesses)
    assert _specialization(kernel, 64, 256) != _specialization(kernel, 64, 257)


def test_batch_arguments_were_specialized_without_the_mark() -> None:
    # what the test above guards against: the same kernel without do_not_specialize
    bare = JITFunction(KERNELS["hetgmp.embedding.kernels.rows_triton:take_rows_kernel"].fn)
    full, partial = (_specialization(bare, n, 256) for n in (8192 * 26, 2483 * 26))
    assert full != partial


def test_capacities_are_multiples_of_16() -> None:
    # q, p (and the payload strides made of them) are FIXED: their specialization must not
    # change when they grow, which holds because they are multiples of 256
    from hetgmp.embedding.padded.buffers import grow
    from hetgmp.embedding.padded.whole import round_up

    for need in (1, 17, 255, 257, 64558, 212992):
        assert grow(0, need) % 16 == 0 and grow(grow(0, need), 3 * need) % 16 == 0
        assert round_up(need) % 16 == 0
