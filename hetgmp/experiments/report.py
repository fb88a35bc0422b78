"""Markdown tables of aggregated sweep rows (mean, with +- std when there are repeats)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hetgmp.experiments.table import Row


def _cell(row: Row, key: str, fmt: str) -> str:
    v = row.get(key)
    if v is None or v == "":
        return "-"
    if not isinstance(v, (int, float)):
        return str(v)
    text = format(v, fmt)
    std = row.get(f"{key}_std")
    if isinstance(std, (int, float)) and std > 0 and int(row.get("runs", 1)) > 1:
        text += f" ± {format(std, fmt)}"
    return text


def markdown_table(rows: Sequence[Row], columns: Sequence[tuple[str, str, str]]) -> str:
    """``columns``: (key, header, format spec). One line per row, GitHub markdown."""
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    sep = "|" + "|".join("---:" for _ in columns) + "|"
    body = ["| " + " | ".join(_cell(r, k, f) for k, _, f in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body]) + "\n"


def write_report(path: Path, title: str, text: str, table: str, image: str | None) -> Path:
    """A small markdown file: title, how it was made, the table, the plot."""
    parts = [f"# {title}\n", text.strip() + "\n", table]
    if image:
        parts.append(f"\n![{title}]({image})\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


COMMON_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("val_auc", "AUC", ".4f"),
    ("val_logloss", "logloss", ".4f"),
    ("bytes_per_sample", "bytes/sample", ".1f"),
    ("bytes_per_sample_values", "values", ".1f"),
    ("bytes_per_sample_gradients", "grads", ".1f"),
    ("bytes_per_sample_ids", "ids", ".1f"),
    ("bytes_per_sample_versions", "versions", ".1f"),
    ("mirror_hit", "mirror hit", ".3f"),
    ("samples_per_s", "samples/s", ".0f"),
    ("table_mb_max", "table MB/worker", ".2f"),
    ("peak_rss_mb_max", "peak RSS MB", ".0f"),
    ("runs", "runs", "d"),
)
