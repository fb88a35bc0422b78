"""The staleness rule lives in hetgmp/embedding/protocol.py only (issue 29).

* Its Triton restatement (hetgmp/embedding/padded/rule_triton.py, which the fused kernels
  call) gives the protocol functions' answers on the same inputs, in Triton's interpreter
  (``TRITON_INTERPRET=1`` must be set before triton is imported: a subprocess).
* No other code of ``hetgmp/embedding/`` compares a lag or a pending count with the bound itself: the
  Python code calls the protocol functions, the Triton kernels the restatement (comments and
  strings do not count).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "hetgmp"
# where the rule may be written out: the protocol and its one Triton restatement
RULE_HOMES = {PKG / "embedding" / "protocol.py", PKG / "embedding" / "padded" / "rule_triton.py"}
SCRIPT = textwrap.dedent(
    """
    import torch
    import triton
    import triton.language as tl

    from hetgmp.embedding import protocol
    from hetgmp.embedding.padded import rule_triton as rule

    @triton.jit
    def rules_kernel(x_ptr, out_ptr, n, bound, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        x = tl.load(x_ptr + i, mask=m, other=0)
        tl.store(out_ptr + i, rule.within_bound(x, bound).to(tl.int8), mask=m)
        tl.store(out_ptr + n + i, rule.beyond_bound(x, bound).to(tl.int8), mask=m)
        tl.store(out_ptr + 2 * n + i, rule.is_due(x, bound).to(tl.int8), mask=m)

    x = torch.arange(-3, 40, dtype=torch.int64)  # lags / pending counts, negative ones too
    for bound in (0, 1, 2, 5, 17, 100):
        out = torch.zeros(3 * x.numel(), dtype=torch.int8)
        rules_kernel[(triton.cdiv(x.numel(), 16),)](x, out, x.numel(), bound, BLOCK=16)
        got = out.view(3, -1).bool()
        assert torch.equal(got[0], protocol.within_bound(x, bound)), bound
        assert torch.equal(got[1], protocol.beyond_bound(x, bound)), bound
        assert torch.equal(got[2], protocol.is_due(x, bound)), bound
        assert torch.equal(got[0], ~got[1])  # (the read rule's two sides)
    print("ok")
    """
)


def test_triton_rule_matches_protocol_in_interpreter(tmp_path) -> None:
    pytest.importorskip("triton")
    script = tmp_path / "rule_check.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0 and p.stdout.split() == ["ok"], p.stdout + p.stderr


def _is_bound(node: ast.expr) -> bool:
    """``bound`` or ``x.bound``."""
    return (isinstance(node, ast.Name) and node.id == "bound") or (
        isinstance(node, ast.Attribute) and node.attr == "bound"
    )


def _is_constant(node: ast.expr) -> bool:
    """A literal or a module constant (``0``, ``I32_MAX``): a check of the bound's range."""
    return isinstance(node, ast.Constant) or (isinstance(node, ast.Name) and node.id.isupper())


def bound_comparisons(source: str) -> list[tuple[int, str]]:
    """``(line, code)`` of every comparison of a value with a bound (``lag > bound``,
    ``pend <= st.bound``, ``bound < x``) in ``source``; checks of the bound against constants
    (``0 <= bound < I32_MAX``) do not count, nor do comments and strings."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for left, op, right in zip(sides[:-1], node.ops, sides[1:], strict=True):
            if not isinstance(op, (ast.Gt, ast.GtE, ast.Lt, ast.LtE)):
                continue
            for mine, other in ((left, right), (right, left)):
                if _is_bound(mine) and not _is_constant(other):
                    found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_restatement_of_the_rule_outside_protocol() -> None:
    found = []
    for path in sorted((PKG / "embedding").rglob("*.py")):  # (elsewhere ``bound`` is not it)
        if path in RULE_HOMES:
            continue
        for line, code in bound_comparisons(path.read_text()):
            found.append(f"{path.relative_to(ROOT)}:{line}: {code}")
    assert not found, f"the staleness rule restated (call hetgmp.embedding.protocol): {found}"


def test_the_restatement_check_sees_a_comparison() -> None:
    """(The checker itself) both orders, attribute bounds, chained comparisons; not range
    checks against constants, other names, comments or strings."""
    for code in (
        "a = lag > bound",
        "d = pend <= st.bound",
        "x = bound < lag",
        "y = 0 < q <= bound",
    ):
        assert bound_comparisons(code), code
    for code in (
        "a = lag > max_lag", "b = bound + 1", "c = upper_bound > 3", "ok = 0 <= bound < I32_MAX",
        "s = 'lag > bound'  # pending > bound",
    ):  # fmt: skip
        assert not bound_comparisons(code), code
