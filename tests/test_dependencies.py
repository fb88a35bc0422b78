"""What pyproject.toml declares matches what the code imports (issue 15 item 11)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(reqs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~; \[]", r, maxsplit=1)[0].lower() for r in reqs}


def _imported_top_level() -> set[str]:
    """Top-level modules imported anywhere in the package, the scripts, tests and benches."""
    found: set[str] = set()
    for folder in ("hetgmp", "partition", "examples", "bench", "datasets", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module.split(".")[0])
    return found


MODULE_OF = {"pyyaml": "yaml"}  # distributions whose import name differs


def test_every_required_dependency_is_imported():
    imported = _imported_top_level()
    never = {
        n for n in _names(PROJECT["dependencies"])
        if MODULE_OF.get(n, n.replace("-", "_")) not in imported
    }  # fmt: skip
    assert not never, f"declared in dependencies but never imported: {sorted(never)}"
    assert "scipy" not in _names(PROJECT["dependencies"])


def test_optional_dependencies_sit_in_their_extras():
    extras = PROJECT["optional-dependencies"]
    assert "matplotlib" not in _names(PROJECT["dependencies"])
    assert _names(extras["plots"]) == {"matplotlib"}
    assert _names(extras["gpu"]) == {"triton"}
    assert "triton" not in _names(extras["test"])
    assert _names(extras["async"]) == {"pyzmq"}
    # make install (what the tests run on) installs the extras the tests use
    assert re.search(r'-e "\.\[test,mpi,plots,gpu,async\]"', (ROOT / "Makefile").read_text())


@pytest.mark.parametrize("experiment", ["store_rate", "staleness", "partition_compare"])
def test_missing_matplotlib_is_one_clear_error_before_the_runs(experiment):
    """With matplotlib not importable (sys.modules entry None), an experiment stops at once
    with the install hint, before it partitions or trains anything."""
    fn = {"partition_compare": "run_partition_compare"}.get(experiment, f"run_{experiment}")
    code = f"""
import sys
sys.modules["matplotlib"] = None
from hetgmp.experiments.{experiment} import {fn}
from hetgmp.experiments.plots import PlotsUnavailableError
try:
    {fn}(None)
except PlotsUnavailableError as err:
    print("ERR", err)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert (
        "ERR the experiment plots need matplotlib, an optional dependency: "
        "pip install 'hetgmp[plots]'" in out.stdout
    )
