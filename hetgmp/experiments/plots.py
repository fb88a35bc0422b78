"""PNG plots of the sweeps (matplotlib, Agg backend: no display needed).

matplotlib is an optional dependency (the ``plots`` extra): it is imported when a plot is made,
and the experiments call :func:`require` before their runs, so a missing matplotlib is one
clear error at the start rather than a traceback after hours of runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from hetgmp.counter_names import KINDS
from hetgmp.experiments.table import Row

if TYPE_CHECKING:
    import matplotlib.pyplot as plt

DPI = 90
INSTALL_HINT = "pip install 'hetgmp[plots]' (in a checkout: pip install -e '.[plots]')"


class PlotsUnavailableError(RuntimeError):
    """matplotlib, needed for the experiments' plots, is not installed."""


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend, or :class:`PlotsUnavailableError`."""
    try:
        import matplotlib
    except ImportError as err:
        raise PlotsUnavailableError(
            f"the experiment plots need matplotlib, an optional dependency: {INSTALL_HINT}"
        ) from err
    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def require() -> None:
    """Raise :class:`PlotsUnavailableError` now if plots cannot be made later."""
    pyplot()


def _vals(rows: Sequence[Row], key: str) -> np.ndarray:
    return np.array([np.nan if r.get(key) in (None, "") else float(r[key]) for r in rows])


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path


def _symlog_x(ax: plt.Axes, xs: np.ndarray) -> None:
    pos = xs[xs > 0]
    if pos.size:
        ax.set_xscale("symlog", linthresh=float(pos.min()))


def plot_store_rate(agg: Sequence[Row], path: Path, title: str = "") -> Path:
    """Bytes/sample by kind and AUC vs store rate (mean over repeats, bars = std)."""
    rows = sorted(agg, key=lambda r: float(r["store_rate"]))
    x = _vals(rows, "store_rate")
    fig, (a1, a2) = pyplot().subplots(1, 2, figsize=(10, 3.8))
    a1.errorbar(
        x,
        _vals(rows, "bytes_per_sample"),
        yerr=_vals(rows, "bytes_per_sample_std"),
        marker="o",
        color="k",
        label="total",
    )
    for kind in KINDS:
        a1.plot(x, _vals(rows, f"bytes_per_sample_{kind}"), marker=".", label=kind)
    a1.set_xlabel("store rate")
    a1.set_ylabel("embedding bytes sent / sample")
    a1.legend(fontsize=8)
    a2.errorbar(
        x, _vals(rows, "val_auc"), yerr=_vals(rows, "val_auc_std"), marker="o", label="final AUC"
    )
    a2.set_xlabel("store rate")
    a2.set_ylabel("test AUC")
    hit = a2.twinx()
    hit.plot(x, _vals(rows, "mirror_hit"), "s--", color="tab:green", label="mirror hit rate")
    hit.set_ylabel("mirror hit rate", color="tab:green")
    for ax in (a1, a2):
        _symlog_x(ax, x)
        ax.grid(alpha=0.3)
    fig.suptitle(title or "store-rate sweep")
    return _save(fig, path)


def mean_curve(raw: Sequence[Row]) -> tuple[np.ndarray, np.ndarray]:
    """(samples seen, mean AUC) over the repeats' AUC curves (points common to all repeats)."""
    curves = [json.loads(r["auc_curve"]) for r in raw if r.get("auc_curve")]
    curves = [c for c in curves if c]
    if not curves:
        return np.zeros(0), np.zeros(0)
    n = min(len(c) for c in curves)
    xs = np.array([p[0] for p in curves[0][:n]], dtype=float)
    ys = np.mean([[p[1] for p in c[:n]] for c in curves], axis=0)
    return xs, ys


def plot_staleness(raw: Sequence[Row], agg: Sequence[Row], path: Path, title: str = "") -> Path:
    """AUC vs samples seen, one line per bound; final AUC and bytes/sample vs bound."""
    fig, (a1, a2) = pyplot().subplots(1, 2, figsize=(10, 3.8))
    bounds = sorted({int(r["bound"]) for r in raw})
    for b in bounds:
        xs, ys = mean_curve([r for r in raw if int(r["bound"]) == b])
        if xs.size:
            a1.plot(xs, ys, marker=".", label=f"bound {b}")
    a1.set_xlabel("training samples seen")
    a1.set_ylabel("test AUC")
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3)
    rows = sorted(agg, key=lambda r: float(r["bound"]))
    x = _vals(rows, "bound")
    a2.errorbar(x, _vals(rows, "val_auc"), yerr=_vals(rows, "val_auc_std"), marker="o")
    a2.set_xlabel("staleness bound")
    a2.set_ylabel("final test AUC")
    _symlog_x(a2, x)
    a2.grid(alpha=0.3)
    by = a2.twinx()
    by.plot(x, _vals(rows, "bytes_per_sample"), "s--", color="tab:red")
    by.set_ylabel("bytes / sample", color="tab:red")
    fig.suptitle(title or "staleness ablation")
    return _save(fig, path)


def plot_partition(agg: Sequence[Row], path: Path, title: str = "") -> Path:
    """Predicted vs measured remote rows per step (y = x, +-20 %), and bytes/sample per method."""
    fig, (a1, a2) = pyplot().subplots(1, 2, figsize=(10, 3.8))
    methods = sorted({str(r["method"]) for r in agg})
    parts = sorted({int(r["ranks"]) for r in agg})
    markers = dict(zip(parts, "os^Dv<>p", strict=False))
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    for r in agg:
        a1.scatter(
            float(r["predicted_fetches_per_step"]),
            float(r["remote_rows_per_step"]),
            color=colors[str(r["method"])],
            marker=markers[int(r["ranks"])],
            s=30,
        )
    lim = [
        v
        for r in agg
        for v in (float(r["predicted_fetches_per_step"]), float(r["remote_rows_per_step"]))
        if v > 0
    ]
    if lim:
        lo, hi = min(lim) * 0.8, max(lim) * 1.25
        line = np.array([lo, hi])
        a1.plot(line, line, "k-", lw=0.8)
        a1.fill_between(line, line * 0.8, line * 1.2, color="k", alpha=0.08, label="+-20 %")
        a1.set_xscale("log")
        a1.set_yscale("log")
    for m in methods:
        a1.scatter([], [], color=colors[m], label=m)
    for p in parts:
        a1.scatter([], [], color="grey", marker=markers[p], label=f"{p} parts")
    a1.set_xlabel("predicted remote rows / step (run's batch size)")
    a1.set_ylabel("measured remote rows / step")
    a1.legend(fontsize=7)
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        ys = [
            next(
                (
                    float(r["bytes_per_sample"])
                    for r in agg
                    if r["method"] == m and int(r["ranks"]) == p
                ),
                np.nan,
            )
            for p in parts
        ]
        a2.bar(np.arange(len(parts)) + i * width, ys, width, color=colors[m], label=m)
    a2.set_xticks(np.arange(len(parts)) + 0.4 - width / 2, [f"{p} parts" for p in parts])
    a2.set_ylabel("measured bytes / sample")
    a2.legend(fontsize=7)
    fig.suptitle(title or "partition methods: predicted vs measured communication")
    return _save(fig, path)
