"""Loading the Triton row kernels and launching kernels with little host time.

:func:`_triton` imports :mod:`.rows_triton` once (or says why Triton is unusable);
:func:`launch` keeps the compiled kernel per specialization key and calls its launcher
directly. Why: Triton's ``kernel[grid](...)`` (``JITFunction.run``) binds the arguments,
computes their specialization and the cache key, looks up device, stream and launch hooks on
every call: ~21 us of host time per launch on the H200 machine, 3x the ~7 us of a torch op,
and the one-rank step launches three kernels. ``HETGMP_FAST_LAUNCH=0`` or ``FAST_LAUNCH =
False`` turns that off; ``bench/gpu/host_overhead.py --launch`` measures both.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import warnings
from types import SimpleNamespace
from typing import Any

import torch


@functools.lru_cache(maxsize=1)
def interpreted() -> bool:
    """Whether Triton runs its kernels in its interpreter (``TRITON_INTERPRET=1``, which
    Triton reads itself: CPU tensors, slow; the tests' way to run the kernels)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _triton() -> Any:
    """The Triton row and batch-plan kernels (a namespace: ``triton``, ``scatter``, ``take``,
    ``take_local``, ``mark_local``, ``put``, ``adagrad``, ``prep_*`` (:mod:`.prep_triton`),
    ``compiled``, ``hooks``), or the import error's text if Triton is unusable."""
    try:
        import triton

        k = importlib.import_module("hetgmp.embedding.kernels.rows_triton")
        p = importlib.import_module("hetgmp.embedding.kernels.prep_triton")
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        return f"{type(e).__name__}: {e}"
    try:  # (launch()'s fast path; triton.knobs exists since Triton 3.3)
        from triton import knobs
        from triton.runtime.jit import JITFunction

        compiled = isinstance(k.scatter_add_rows_kernel, JITFunction)
        compiled = compiled and not interpreted()
        hooks = knobs.runtime
    except ImportError:
        compiled, hooks = False, None
    return SimpleNamespace(
        triton=triton, scatter=k.scatter_add_rows_kernel, take=k.take_rows_kernel,
        scatter_fields=k.scatter_add_fields_kernel,
        take_local=k.take_local_kernel, mark_local=k.mark_local_kernel, put=k.put_rows_kernel,
        adagrad=k.adagrad_rows_kernel, prep_mark=p.prep_mark_kernel, prep_key=p.prep_key_kernel,
        prep_mark_fields=p.prep_mark_fields_kernel, prep_scan=p.prep_scan_kernel,
        prep_place=p.prep_place_kernel, prep_inv=p.prep_inv_kernel,
        compiled=compiled,  # compiled kernels, not the interpreter's: launch()'s fast path
        hooks=hooks,  # triton.knobs.runtime: launch_enter_hook / launch_exit_hook (profilers)
    )  # fmt: skip


def triton_available() -> str | None:
    """``None`` if the Triton kernels can run, else why not."""
    got = _triton()
    return got if isinstance(got, str) else None


def _kernels() -> Any:
    got = _triton()
    if isinstance(got, str):
        raise RuntimeError(f"Triton kernels unavailable: {got}")
    return got


def on_device(t: torch.Tensor) -> Any:
    """Triton launches on torch's current device: make it ``t``'s."""
    if t.is_cuda and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


def row_tiles(triton: Any, d: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_D): a tile of 4096 elements per program, whole rows up to 128 wide."""
    block_d = min(triton.next_power_of_2(d), 128)
    return max(1, 4096 // block_d), block_d


_row_tiles = row_tiles  # (the name bench/gpu/host_overhead.py uses)


# Triton specializes a compiled kernel on the arguments (see _arg_key); launch() keeps one per key.
FAST_LAUNCH = os.environ.get("HETGMP_FAST_LAUNCH", "1") != "0"  # opt-out (also per call)
# Every VERIFY_EVERY-th launch per key goes through the normal path again, which must return
# the very CompiledKernel cached for the key (else this module's key misses something Triton
# specializes on: it raises). The second launch per key is always such a check.
VERIFY_EVERY = 1024
_I32_MIN, _I32_MAX, _I64_MAX = -(2**31), 2**31 - 1, 2**63 - 1
# key -> [CompiledKernel, fast launches since the last check, (its run, function, metadata)]
_launch_cache: dict[tuple[Any, ...], list[Any]] = {}
_refused: set[int] = set()  # id() of kernels the fast path does not handle (warned once)


def _arg_key(a: Any) -> Any:
    """What Triton specializes a non-constexpr argument on: a tensor's dtype and 16-byte
    alignment; an int's width (i32 / i64 / u64), divisibility by 16 and being 1; a float:
    nothing (fp32, never specialized). For a ``do_not_specialize`` argument (the kernels'
    batch sizes) this is finer than Triton's key: a new key's first launch takes the normal
    path and finds the kernel already compiled (no compile, one slower launch)."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool):  # (before int: bool is an int)
        return ("u1", a)
    if isinstance(a, int):
        width = 0 if _I32_MIN <= a <= _I32_MAX else 1 if -_I64_MAX - 1 <= a <= _I64_MAX else 2
        return (width, a % 16 == 0, a == 1)
    if isinstance(a, float):
        return "fp32"
    raise TypeError(f"launch: unsupported kernel argument type {type(a).__name__}")


def _raw_stream(device: int) -> int:
    """The current CUDA stream of device ``device`` as an int (what Triton launches on)."""
    return torch.cuda.current_stream(device).cuda_stream


if hasattr(torch._C, "_cuda_getCurrentRawStream"):  # what Triton's own driver calls: no
    _raw_stream = torch._C._cuda_getCurrentRawStream  # noqa: F811 - Stream object made


def launch(
    kernel: Any,
    grid: tuple[int, ...],
    args: tuple[Any, ...],
    consts: dict[str, Any],
    *,
    fast: bool | None = None,
) -> None:
    """``kernel[grid](*args, **consts)`` (``args``: the kernel's non-constexpr parameters in
    order, ``consts``: its trailing constexpr parameters in order), on the current device of
    the first tensor argument, through the cached launcher when ``fast`` (default
    :data:`FAST_LAUNCH`) and the kernel is a compiled ``JITFunction``; the interpreter
    (``TRITON_INTERPRET=1``), launch hooks (profilers) and pre-run hooks take the normal path.
    A fast-path failure raises; a kernel it cannot handle is launched normally with a warning.
    """
    if fast is None:
        fast = FAST_LAUNCH
    k = _kernels()
    hooks = k.hooks
    if not fast or not k.compiled or (
        (hooks.launch_enter_hook is not None and getattr(hooks.launch_enter_hook, "calls", True))
        or (hooks.launch_exit_hook is not None and getattr(hooks.launch_exit_hook, "calls", True))
    ):  # fmt: skip
        kernel[grid](*args, **consts)
        return
    consts = _with_defaults(kernel, len(args), consts)
    dev = args[0].device.index
    key = (id(kernel), dev, *[_arg_key(a) for a in args], *consts.values())
    entry = _launch_cache.get(key)
    if entry is not None and entry[1] < VERIFY_EVERY:
        entry[1] += 1
        run, function, packed = entry[2]
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        # CompiledKernel.run's signature in Triton 3.6 and 3.9 (what JITFunction.run calls):
        # grid, stream, function, packed metadata, launch metadata + enter / exit hooks (None:
        # no hooks, checked above), then every parameter in order, constexprs included.
        run(grid[0], g1, g2, _raw_stream(dev), function, packed, None, None, None, *args,
            *consts.values())  # fmt: skip
        return
    # First launch for the key, or a check: the normal path, which returns the kernel it ran.
    _normal_launch(k, kernel, grid, args, consts, key, entry)


_defaults: dict[int, dict[str, Any]] = {}  # id(kernel) -> its trailing defaulted constexprs


def _with_defaults(kernel: Any, nargs: int, consts: dict[str, Any]) -> dict[str, Any]:
    """``consts`` completed with the defaults of the kernel's trailing constexprs it leaves
    out: the fast path passes every parameter in order (a kernel launched without a defaulted
    flag was refused by it, and ran at ~3x the host time)."""
    names = getattr(kernel, "arg_names", ())  # (every launch: no copy, the common case)
    if len(names) <= nargs + len(consts):
        return consts
    missing = _defaults.get(id(kernel))
    if missing is None:
        sig = getattr(kernel, "signature", None)
        params = sig.parameters if sig is not None else {}
        missing = {n: params[n].default for n in names[nargs:] if n in params
                   and params[n].default is not params[n].empty}  # fmt: skip
        _defaults[id(kernel)] = missing
    full = {}
    for n in names[nargs:]:
        if n in consts:
            full[n] = consts[n]
        elif n in missing:
            full[n] = missing[n]
        else:  # (a parameter without a default left out: the normal path says which)
            return consts
    return full


def _normal_launch(
    k: Any, kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], consts: dict[str, Any],
    key: tuple[Any, ...], entry: list[Any] | None,
) -> None:  # fmt: skip
    """:func:`launch` through ``kernel[grid]``: caches what it ran for ``key`` (first launch),
    or checks that it is the kernel cached (``entry``)."""
    got = kernel[grid](*args, **consts)
    if entry is None:
        names = list(getattr(kernel, "arg_names", ()))
        usable = (
            all(hasattr(got, a) for a in ("run", "function", "packed_metadata"))
            and len(names) == len(args) + len(consts)
            and names[len(args) :] == list(consts)
            and not getattr(kernel, "pre_run_hooks", None)
        )
        if usable:  # (the next launch for the key is a check)
            _launch_cache[key] = [got, VERIFY_EVERY, (got.run, got.function, got.packed_metadata)]
        elif id(kernel) not in _refused:
            _refused.add(id(kernel))
            warnings.warn(
                f"hetgmp fast Triton launch: {getattr(kernel, '__name__', kernel)} (Triton "
                f"{k.triton.__version__}) is not a plain compiled kernel ({type(got).__name__} "
                "returned, or unexpected parameters); it is launched through kernel[grid] (~3x "
                "the host time)",
                stacklevel=3,
            )
        return
    if got is not entry[0]:
        raise RuntimeError(
            f"hetgmp fast Triton launch: Triton {k.triton.__version__} ran another compiled "
            f"variant of {getattr(kernel, '__name__', kernel)} than the one cached for key "
            f"{key[1:]}: the launcher's specialization key misses something; set "
            "HETGMP_FAST_LAUNCH=0 (hetgmp.embedding.kernels.FAST_LAUNCH = False) and report it"
        )
    entry[1] = 0
