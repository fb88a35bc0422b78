"""How the commands print a set of facts on one line: ``key=value`` pairs, never a Python
``dict`` repr (``{'train': 2700}``), so lines stay readable and ``grep``/``awk``-able."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, str) and (not v or any(c.isspace() for c in v)):
        return repr(v)  # (a value with spaces stays one token)
    return str(v)


def key_values(fields: Mapping[str, Any], prefix: str = "") -> str:
    """``a=1 b=x c.d=2``: nested mappings flattened with dotted keys, in the mapping's order."""
    parts = []
    for k, v in fields.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            parts.append(key_values(v, f"{key}."))
        else:
            parts.append(f"{key}={_value(v)}")
    return " ".join(p for p in parts if p)
