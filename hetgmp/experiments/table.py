"""The run table: one CSV row per finished run (every parameter and metric), resumable.

A row's ``key`` is a digest of the run's parameters (including its repeat index), so a second
invocation of the same sweep finds its finished runs and skips them. Rows are rewritten
atomically after every run: an interrupted sweep loses at most the run in flight.
"""

from __future__ import annotations

import csv
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

Row = dict[str, Any]


class RunTableError(ValueError):
    """The CSV exists but cannot be read as a run table."""


def _parse(value: str) -> Any:
    """CSV text back to int / float / str ('' stays '')."""
    if value == "":
        return ""
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


class RunTable:
    """Rows of one sweep's CSV, keyed by ``key``; ``add`` rewrites the file atomically."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.rows: list[Row] = []
        if self.path.exists():
            with open(self.path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                if reader.fieldnames is None or "key" not in reader.fieldnames:
                    raise RunTableError(f"{self.path}: not a run table (no 'key' column)")
                self.rows = [{k: _parse(v or "") for k, v in r.items()} for r in reader]

    def has(self, key: str) -> bool:
        return any(r.get("key") == key for r in self.rows)

    def add(self, row: Row) -> None:
        """Append (or replace the row with the same key) and write the CSV."""
        self.rows = [r for r in self.rows if r.get("key") != row["key"]] + [row]
        self.write()

    def columns(self) -> list[str]:
        cols: list[str] = []
        for r in self.rows:
            cols.extend(k for k in r if k not in cols)
        return cols

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=self.columns(), restval="")
            w.writeheader()
            w.writerows(self.rows)
        os.replace(tmp, self.path)


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or v == "" or v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def aggregate(rows: Iterable[Row], by: Sequence[str], metrics: Sequence[str]) -> list[Row]:
    """Group ``rows`` by the ``by`` columns; per metric the mean, ``<m>_std`` and ``runs``.

    The standard deviation is the sample one over repeats (0 for a single run).
    """
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k, "") for k in by), []).append(r)
    out: list[Row] = []
    for gkey, members in groups.items():
        agg: Row = dict(zip(by, gkey, strict=True))
        agg["runs"] = len(members)
        for m in metrics:
            vals = [x for x in (_number(r.get(m)) for r in members) if x is not None]
            agg[m] = statistics.fmean(vals) if vals else None
            agg[f"{m}_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0 if vals else None
        out.append(agg)
    out.sort(key=lambda r: tuple(_sort_key(r[k]) for k in by))
    return out


def _sort_key(v: Any) -> tuple[int, Any]:
    x = _number(v)
    return (0, x) if x is not None else (1, str(v))
