"""The end-of-run summary for people: a few aligned lines after the machine-readable RESULT.

    summary
      AUC          0.7507   (best possible on this data set 0.7880)
      logloss      0.4690
      samples/s    52011
      bytes/sample 1234.5
      mirror hits  0.9312
      wall time    12.3 s

Every number goes through :func:`hetgmp.train.runlog.number`, the one format of a run's
console lines (issue 32: one number format within a run). A figure the run does not have (no
evaluation, a one-rank table that moves no bytes) is left out rather than printed as 0; a run
no longer than its warm-up shows the warm-up's pace, marked.
"""

from __future__ import annotations

from typing import Any

from hetgmp.train.runlog import number


def summary_lines(results: dict[str, Any], *, best_auc: float | None, wall_s: float) -> list[str]:
    """The summary of ``results`` (as :func:`hetgmp.train.report.results` returns them)."""
    emb = results.get("embedding_train") or {}
    speed, speed_tail = results.get("speed"), ""
    if speed is None and results.get("warmup_speed") is not None:
        # (a run no longer than --warmup-steps times no steady step: its pace, said as such)
        speed, speed_tail = results["warmup_speed"], "   (warm-up steps only)"
    rows: list[tuple[str, Any, str]] = [
        ("AUC", results.get("val_auc"), ""),
        ("logloss", results.get("val_loss"), ""),
        ("samples/s", speed, speed_tail),
        ("bytes/sample", emb.get("bytes_per_sample"), ""),
        ("mirror hits", emb.get("mirror_hit"), ""),
        ("wall time", wall_s, " s"),
    ]
    if best_auc is not None and results.get("val_auc") is not None:
        rows[0] = (
            "AUC",
            results["val_auc"],
            f"   (best possible on this data set {number(best_auc)})",
        )
    shown = [(name, v, tail) for name, v, tail in rows if v is not None]
    width = max(len(name) for name, _, _ in shown)
    return ["summary"] + [f"  {name:<{width}} {number(v)}{tail}" for name, v, tail in shown]
