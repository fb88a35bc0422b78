"""Access to the compiled extension ``hetgmp._native``.

There is deliberately no pure-Python fallback: the hot loops are orders of magnitude slower in
Python, and a silent fallback would turn a broken install into a mysteriously slow one.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

_FIX = (
    "hetgmp's native extension (hetgmp._native) is not built or failed to load: {err}. "
    "Rebuild it with `make install` (or `pip install -e .` inside the project's virtualenv); "
    "this needs a C++17 compiler, CMake >= 3.18 and OpenMP."
)


class NativeExtensionError(ImportError):
    """The compiled extension is missing or broken."""


def native() -> ModuleType:
    """Return the compiled extension module, or raise :class:`NativeExtensionError`."""
    try:
        from hetgmp import _native
    except ImportError as err:  # pragma: no cover - exercised by broken installs only
        raise NativeExtensionError(_FIX.format(err=err)) from err
    return _native


def native_function(name: str) -> Callable[..., Any]:
    """The extension's function ``name``, or :class:`NativeExtensionError` when the built
    extension predates it (a stale ``.so`` from before a source change: rebuild)."""
    fn = getattr(native(), name, None)
    if fn is None:
        raise NativeExtensionError(
            _FIX.format(err=f"the built extension has no function {name!r} (it is out of date)")
        )
    return fn
