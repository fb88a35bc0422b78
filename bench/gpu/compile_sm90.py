"""Compile the Triton kernels the CPU tests launch for sm_90 with the GPU machines' Triton
(3.6), without a GPU, so a kernel that runs in the interpreter but fails to compile there
(e.g. ``PassManager::run failed`` in TritonGPURemoveLayoutConversions) is caught before it
costs device time.

* ``collect [--out SPECS] PYTEST_ARGS...``: runs pytest in-process on ``PYTEST_ARGS`` with
  every ``InterpretedFunction.run`` (Triton's interpreter, ``TRITON_INTERPRET=1``) recorded, in
  this process and in every Python process it starts (a ``sitecustomize`` on ``PYTHONPATH``:
  the tests run kernels in subprocesses and spawned ranks). Each launch becomes the spec
  Triton 3.6's JIT would compile on CUDA (``create_function_from_signature`` +
  ``native_specialize_impl``, mirrored below): a tensor is ``*dtype`` with
  ``tt.divisibility`` 16 when its address is 16-byte aligned, an int is ``constexpr`` 1 when 1,
  else i32 / i64 / u64 by value, divisible when ``% 16 == 0`` (neither for a
  ``do_not_specialize`` parameter, no divisibility for ``do_not_specialize_on_alignment``), a
  float fp32, a bool u1, None a constexpr None. Identical specs are kept once; a kernel with a
  ``D`` constexpr also gets a ``D=128`` variant when its column tile follows ``row_tiles``
  (``BD`` / ``BLOCK_D`` = next power of 2 of D: 128 then; ``BR`` / ``BLOCK_R`` <= 4096 // BD
  becomes min(BR, 32)), else none (other arguments, e.g. strides, stay as recorded).
* ``compile [--swap MODULE=FILE]... SPECS``: in a process with ``PYTHONPATH`` = the Triton 3.6
  copy (``$HETGMP_TRITON36``, default /tmp/t36) first (re-executing itself so), compiles each
  spec for ``GPUTarget("cuda", 90, 32)``; one line per spec (``#i``: its index in SPECS), ``ok``
  or ``FAIL`` with the first error line (the MLIR diagnostic's too); exit 1 if any fails. ``--swap`` compiles a module's kernels from another file
  (e.g. an older version: ``git show HEAD:path > /tmp/old.py``).
* ``PYTEST_ARGS...`` alone: both, e.g.
  ``python bench/gpu/compile_sm90.py tests/test_bags_compact.py -k triton``.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
T36 = os.environ.get("HETGMP_TRITON36", "/tmp/t36")
RECORD_ENV = "HETGMP_SM90_RECORD"  # the folder each process appends its specs to
CHILD_ENV = "HETGMP_SM90_COMPILER"  # set in the re-executed compile process
DEFAULT_SPECS = Path(tempfile.gettempdir()) / "compile_sm90_specs.json"
OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "debug")
TILE = 4096  # row_tiles: elements per program (BR = TILE // BD)
_I32, _I64 = 2**31, 2**63
_seen: set[str] = set()
_lock = threading.Lock()


# ---------------------------------------------------------------- recording (Triton 3.9)
def _params(f: Any) -> list[Any]:
    """Triton's ``KernelParam`` of each parameter of the interpreted kernel ``f``."""
    ps = getattr(f, "_sm90_params", None)
    if ps is None:
        from triton.runtime.jit import KernelParam

        dns = f.kwargs.get("do_not_specialize") or ()
        dno = f.kwargs.get("do_not_specialize_on_alignment") or ()
        sig = inspect.signature(f.fn).parameters.values()
        ps = [KernelParam(i, p, i in dns or p.name in dns, i in dno or p.name in dno)
              for i, p in enumerate(sig)]  # fmt: skip
        f._sm90_params = ps
    return ps


def _value_spec(v: Any, is_const: bool, spec: bool, align: bool) -> tuple[str, Any]:
    """(type, attr) as Triton 3.6's ``native_specialize_impl`` on CUDA: attr ``"D"`` (16
    divides), ``""`` (not known to) or None (not specialized); ("constexpr", value) for 1, None."""
    if v is None:
        return "constexpr", None
    if isinstance(v, bool):
        return "u1", None
    if isinstance(v, int):
        if spec and v == 1:
            return "constexpr", 1
        ty = "i32" if -_I32 <= v < _I32 else "i64" if -_I64 <= v < _I64 else "u64"
        return ty, (("D" if align and v % 16 == 0 else "") if spec else None)
    if isinstance(v, float):
        return "fp32", None
    if hasattr(v, "data_ptr") and hasattr(v, "dtype"):
        from triton._utils import canonicalize_ptr_dtype

        ty = canonicalize_ptr_dtype(v.dtype, is_const)
        return ty, (("D" if align and v.data_ptr() % 16 == 0 else "") if spec else None)
    raise TypeError(f"unsupported argument type {type(v).__name__}")


def _param_spec(kp: Any, v: Any) -> tuple[str, Any]:
    """One non-constexpr parameter, with its annotation as ``create_function_from_signature``
    (an annotated float / bool is never specialized; an annotated type wins over the value's)."""
    ty, attr = _value_spec(v, kp.is_const, not kp.do_not_specialize,
                           not kp.do_not_specialize_on_alignment)  # fmt: skip
    ann = kp.annotation_type
    if not ann:
        return ty, attr
    if ann == "u1" or ann[:2] in ("fp", "bf"):
        return ann, None
    return ann, attr if isinstance(attr, str) else None


def _jsonable(v: Any) -> Any:
    """A constexpr value as JSON: plain values as they are, a ``tl.dtype`` as
    ``{"dtype": "fp32"}``, a kernel as ``{"fn": "module:name"}``, else ``{"repr": ...}``."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    import triton.language as tl

    if isinstance(v, tl.constexpr):
        return _jsonable(v.value)
    if isinstance(v, tl.dtype):
        return {"dtype": str(v)}
    fn = getattr(v, "fn", None)
    if callable(fn):
        return {"fn": f"{fn.__module__}:{fn.__qualname__}"}
    return {"repr": repr(v)}


def _spec(f: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The compile spec of one launch of the interpreted kernel ``f``."""
    ps = _params(f)
    names = {kp.name for kp in ps}
    bound = inspect.signature(f.fn).bind(*args, **{k: v for k, v in kwargs.items() if k in names})
    bound.apply_defaults()
    sig, consts, attrs = {}, {}, []
    for kp in ps:
        v = bound.arguments[kp.name]
        ty, attr = ("constexpr", v) if kp.is_constexpr else _param_spec(kp, v)
        sig[kp.name] = ty
        if ty == "constexpr":
            consts[kp.name] = _jsonable(attr)
        elif attr == "D":
            attrs.append(kp.name)
    fn = f.fn
    return {"kernel": f"{fn.__module__}:{fn.__qualname__}", "file": inspect.getsourcefile(fn),
            "signature": sig, "constexprs": consts, "attrs": attrs, "variant": "",
            "options": {k: kwargs[k] for k in OPTIONS if k in kwargs}}  # fmt: skip


def _record(f: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Append the launch's spec (once per process) to this process's file."""
    try:
        spec = _spec(f, args, kwargs)
    except Exception as e:  # noqa: BLE001 - never break the test: say so in the specs
        fn = f.fn
        spec = {"kernel": f"{fn.__module__}:{fn.__qualname__}", "error": repr(e)}
    key = json.dumps(spec, sort_keys=True)
    with _lock:
        if key in _seen:
            return
        _seen.add(key)
        path = Path(os.environ[RECORD_ENV]) / f"{os.getpid()}.jsonl"
        with path.open("a") as out:
            out.write(json.dumps(spec) + "\n")  # (the parameters in order)


def _patch(module: Any) -> None:
    """Record every launch of ``module.InterpretedFunction`` (triton.runtime.interpreter)."""
    cls = module.InterpretedFunction
    if getattr(cls.run, "_sm90", False):
        return
    real = cls.run

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        if not warmup:
            _record(self, args, kwargs)
        return real(self, *args, grid=grid, warmup=warmup, **kwargs)

    run._sm90 = True  # type: ignore[attr-defined]
    cls.run = run


class _Finder(importlib.abc.MetaPathFinder):
    """Patches ``triton.runtime.interpreter`` once it is imported (importing triton early
    would break the tests that set ``TRITON_INTERPRET`` before its first import)."""

    NAME = "triton.runtime.interpreter"

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.NAME:
            return None
        finders = [f for f in sys.meta_path if f is not self and hasattr(f, "find_spec")]
        others = (f.find_spec(name, path, target) for f in finders)
        spec = next((s for s in others if s is not None and s.loader is not None), None)
        if spec is None:
            return None
        loader: Any = spec.loader
        real = loader.exec_module

        def exec_module(module: Any) -> None:
            real(module)
            _patch(module)

        loader.exec_module = exec_module
        return spec


def install_hook() -> None:
    """Record launches in this process (when ``$HETGMP_SM90_RECORD`` names a folder)."""
    if not os.environ.get(RECORD_ENV):
        return
    if _Finder.NAME in sys.modules:
        _patch(sys.modules[_Finder.NAME])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _d128(spec: dict[str, Any]) -> dict[str, Any] | None:
    """``spec`` at D=128 with its tiles recomputed as ``row_tiles`` does, or None (no ``D``
    constexpr, D already 128, or a column tile that is not row_tiles' rule)."""
    c = spec.get("constexprs", {})
    d = c.get("D")
    if spec["signature"].get("D") != "constexpr" or type(d) is not int or d == 128:
        return None
    new, bd_old, p2 = dict(c, D=128), 0, 1 << max(0, d - 1).bit_length()
    for name in ("BD", "BLOCK_D"):
        if name in c:
            if c[name] not in (p2, min(p2, 128)):
                return None
            bd_old, new[name] = c[name], 128
    for name in ("BR", "BLOCK_R"):  # (row_tiles' rows, capped or not: min(BR, 4096 // BD))
        if name in c and bd_old and c[name] <= max(1, TILE // bd_old):
            new[name] = min(c[name], TILE // 128)
    return {**spec, "constexprs": new, "variant": "D=128"}


def collect(pytest_args: list[str], out: Path) -> int:
    """Run pytest with launches recorded; write the distinct specs (+ D=128 variants) to
    ``out``. Returns pytest's exit code."""
    import pytest

    rec = Path(tempfile.mkdtemp(prefix="sm90_rec_"))
    hook = rec / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import importlib.util as u\n"
        f"s = u.spec_from_file_location('_compile_sm90_hook', {str(Path(__file__).resolve())!r})\n"
        "m = u.module_from_spec(s)\ns.loader.exec_module(m)\nm.install_hook()\n"
    )
    os.environ[RECORD_ENV] = str(rec)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(hook), os.environ.get("PYTHONPATH", "")] if p
    )
    install_hook()
    rc = int(pytest.main(pytest_args))
    specs: list[dict[str, Any]] = []
    keys: set[str] = set()
    for path in sorted(rec.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            spec = json.loads(line)
            for s in (spec, None if "error" in spec else _d128(spec)):
                key = "" if s is None else json.dumps(s, sort_keys=True)
                if s is not None and key not in keys:
                    keys.add(key)
                    specs.append(s)
    shutil.rmtree(rec, ignore_errors=True)
    specs.sort(key=lambda s: (s["kernel"], s.get("variant", ""), json.dumps(s, sort_keys=True)))
    out.write_text(json.dumps(specs, indent=1))
    kernels = sorted({s["kernel"] for s in specs})
    print(f"compile_sm90: {len(specs)} specs of {len(kernels)} kernels -> {out} (pytest {rc})")
    return rc


# ---------------------------------------------------------------- compiling (Triton 3.6)
def _load_kernel(name: str, file: str | None, swaps: dict[str, str]) -> Any:
    """The kernel ``module:qualname`` (from ``swaps[module]``'s file if given; from its
    recorded file when the module cannot be imported)."""
    mod_name, qual = name.split(":")
    path = swaps.get(mod_name)
    if path is None:
        try:
            obj: Any = importlib.import_module(mod_name)
        except ImportError:
            if not file or not Path(file).is_file():
                raise
            path = file
    if path is not None:
        key = f"_sm90_{abs(hash(path))}"
        obj = sys.modules.get(key)
        if obj is None:
            spec = importlib.util.spec_from_file_location(key, path)
            assert spec is not None and spec.loader is not None
            obj = importlib.util.module_from_spec(spec)
            sys.modules[key] = obj
            spec.loader.exec_module(obj)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _constexpr(v: Any, swaps: dict[str, str]) -> Any:
    if not isinstance(v, dict):
        return v
    if "dtype" in v:
        import triton.language as tl

        return tl.dtype(v["dtype"])
    if "fn" in v:
        return _load_kernel(v["fn"], None, swaps)
    raise TypeError(f"unsupported constexpr {v['repr']}")


def _compile(spec: dict[str, Any], swaps: dict[str, str]) -> None:
    """``triton.compile`` of one spec for sm_90 (raises on failure)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "error" in spec:
        raise RuntimeError(f"not recorded: {spec['error']}")
    fn = _load_kernel(spec["kernel"], spec.get("file"), swaps)
    sig = {n: spec["signature"][n] for n in fn.arg_names}  # (in the parameters' order)
    consts = {k: _constexpr(v, swaps) for k, v in spec["constexprs"].items()}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in spec["attrs"]}
    src = ASTSource(fn, sig, consts, attrs=attrs)
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(spec["options"]))


def _try(spec: dict[str, Any], swaps: dict[str, str]) -> str | None:
    """None if ``spec`` compiles, else its error: the exception's first line and the first
    MLIR ``error:`` line of the compiler's stderr (which dumps the whole module: kept out)."""
    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            _compile(spec, swaps)
            return None
        except Exception as e:  # noqa: BLE001 - any compile failure is reported
            sys.stderr.flush()
            tmp.seek(0)
            lines = [ln.strip() for ln in tmp.read().decode(errors="replace").splitlines()]
            diag = next((ln for ln in lines if " error: " in ln), "")
            msg = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
            return f"{msg} | {diag}"[:400] if diag else msg[:400]
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _label(i: int, spec: dict[str, Any]) -> str:
    consts = " ".join(f"{k}={v}" for k, v in spec.get("constexprs", {}).items())
    variant = f" [{spec['variant']}]" if spec.get("variant") else ""
    return f"#{i} {spec['kernel']}{variant} {consts}"


def compile_specs(path: Path, swaps: dict[str, str]) -> int:
    """Compile every spec of ``path``: 0 if all compile, else 1."""
    if os.environ.get(CHILD_ENV) != "1":  # (re-run with Triton 3.6 first on the path)
        if not (Path(T36) / "triton").is_dir():  # (else the venv's newer Triton: no check)
            sys.exit(f"compile_sm90: no Triton in {T36}: pip install --no-deps --target {T36} "
                     "triton==3.6.0 (or set HETGMP_TRITON36)")  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", RECORD_ENV)}
        env.update({CHILD_ENV: "1", "PYTHONPATH": os.pathsep.join([T36, str(ROOT)])})
        argv = [a for m, p in swaps.items() for a in ("--swap", f"{m}={p}")]
        cmd = [sys.executable, str(Path(__file__).resolve()), "compile", *argv, str(path)]
        return subprocess.run(cmd, env=env, check=False).returncode
    import triton

    print(f"compile_sm90: triton {triton.__version__} ({Path(triton.__file__).parent}), sm_90")
    specs = json.loads(Path(path).read_text())
    fails = 0
    for i, spec in enumerate(specs):
        err = _try(spec, swaps)
        fails += err is not None
        print(f"ok   {_label(i, spec)}" if err is None else f"FAIL {_label(i, spec)}: {err}",
              flush=True)  # fmt: skip
    print(f"compile_sm90: {len(specs) - fails} ok, {fails} FAIL")
    return 1 if fails else 0


def main(argv: list[str]) -> int:
    """``collect`` / ``compile`` / both (see the module docstring)."""
    mode = argv[0] if argv and argv[0] in ("collect", "compile") else "all"
    rest = argv[1:] if mode != "all" else argv
    out, swaps = DEFAULT_SPECS, {}
    while rest and rest[0] in ("--out", "--swap"):
        if rest[0] == "--out":
            out = Path(rest[1])
        else:
            mod, _, file = rest[1].partition("=")
            swaps[mod] = str(Path(file).resolve())
        rest = rest[2:]
    if mode == "compile":
        return compile_specs(Path(rest[0]) if rest else out, swaps)
    rc = collect(rest, out)
    if mode == "collect":
        return rc
    if rc != 0:
        print(f"compile_sm90: pytest exited {rc}; compiling what was recorded")
    return compile_specs(out, swaps) or (0 if json.loads(out.read_text()) else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
