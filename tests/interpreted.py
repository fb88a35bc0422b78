"""Run a script in Triton's interpreter (``TRITON_INTERPRET=1`` must be set before triton is
imported, so: a subprocess) and hand back what it printed, for the kernel tests that compare
a Triton kernel with its torch reference on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_interpreted(
    script: Path, text: str, *args: str, calls: tuple[str, ...] = (), timeout: int = 300
) -> list[str]:
    """Write ``text`` to ``script`` (a file: spawned ranks re-import it), followed by a main
    block making the ``calls`` (e.g. ``"check('cpu')"``), run it with ``args`` in the
    interpreter (the repository importable, ``tests`` too), assert it exited 0, and return its
    output's words."""
    main = "".join(f"\n    {c}" for c in calls)
    script.write_text(text + (f"\nif __name__ == '__main__':{main}\n" if calls else ""))
    paths = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=paths)
    p = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout.split()


def compiled(text: str) -> dict[str, Any]:
    """The namespace of ``text`` run in this process: the same cases, compiled (GPU tests)."""
    ns: dict[str, Any] = {}
    exec(text, ns)  # noqa: S102 - the test module's own cases
    return ns


def mutated_module(module: Any, old: str, new: str) -> Any:
    """A copy of ``module`` (a kernel module) with ``old`` replaced by ``new`` in its source,
    loaded from a file of its own (Triton's ``jit`` reads a kernel's source from its file):
    a mutant the kernel tests must fail on."""
    import importlib.util
    import tempfile

    src = Path(module.__file__).read_text()
    assert old in src, old
    path = Path(tempfile.mkdtemp()) / f"{module.__name__.rsplit('.', 1)[-1]}_mutant.py"
    path.write_text(src.replace(old, new))
    spec = importlib.util.spec_from_file_location(f"{module.__name__}_mutant", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
