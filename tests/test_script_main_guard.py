"""Scripts run by hand or on a GPU machine (``tests/gpu_*.py``, ``bench/``, ``examples/``)
define everything before their ``if __name__ == "__main__":`` block: a function defined below
it does not exist yet when the block runs (a GPU check once called one and died with a
NameError, costing a device call). Checked on the source text alone."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    t = node.test
    names = [t.left, *t.comparators]
    return any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and any(
        isinstance(n, ast.Constant) and n.value == "__main__" for n in names
    )


def test_nothing_is_defined_below_a_main_guard() -> None:
    files = [*ROOT.glob("tests/gpu_*.py"), *ROOT.glob("bench/**/*.py"),
             *ROOT.glob("examples/**/*.py"), *ROOT.glob("partition/**/*.py")]  # fmt: skip
    assert len(files) > 10
    late = []
    for path in files:
        body = ast.parse(path.read_text()).body
        guards = [i for i, node in enumerate(body) if _is_main_guard(node)]
        if not guards:
            continue
        for node in body[guards[0] + 1 :]:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                late.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not late, f"defined below the __main__ block (not yet defined when it runs): {late}"
