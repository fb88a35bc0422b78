"""The partitioner's cost model, evaluated for a *training run* (its batch size and store rate).

The plan's own report (``meta["quality"]``) predicts *remote row fetches per step, summed over
workers*, at the batch size given to ``hetgmp partition`` (default 8192) and with mirrors assumed
always fresh. A training run measures rows fetched from owners per step (``rows_remote``) at its
own ``--batch_size`` and ``--bound``. So the comparable prediction is the same cost model at the
run's batch size, minus the fetches the run's mirrors save, which is what this module computes;
it also turns fetches into bytes with the runtime's wire format (:func:`bytes_per_fetch`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hetgmp.data.format import open_dataset
from hetgmp.partition import cost as costmod
from hetgmp.partition.api import train_rows
from hetgmp.partition.plan import Plan, load_plan
from hetgmp.partition.quality import usage_counts


def bytes_per_fetch(table_dim: int, state_width: int = 0) -> int:
    """Bytes one remote (not stored) row costs per step at bound 0 (both sides together), in the
    runtime's counter kinds since the wire format of commit 149afcf:

    ids 8 + 8 (query id, push id); versions 8 + 8 (push count, owner version of the reply);
    values 4 * (dim + state) (the reply row with its optimizer state); gradients 4 * dim.
    (Queries for rows not stored carry no mirror version any more.)
    """
    return 16 + 16 + 4 * (table_dim + state_width) + 4 * table_dim


def predict_fetches(
    dataset: Path | str,
    plan: Plan | Path | str,
    *,
    batch_size: int,
    store_rates: tuple[float, ...] = (0.0,),
) -> dict[str, Any]:
    """Predicted remote fetches per global step (summed over workers) for a run of ``plan``.

    Returns ``fetches_per_step`` (the plan's model: nominal ``M = N / parts`` samples per worker),
    ``fetches_per_step_actual_m`` (each worker's real sample count as ``M``), and per store rate
    ``with_mirrors[rate]`` (mirrors never stale: the fetches the top mirrors save subtracted).
    """
    ds = open_dataset(Path(dataset))
    pl = plan if isinstance(plan, Plan) else load_plan(Path(plan))
    n, parts, rows = pl.num_samples, pl.nparts, pl.num_rows
    dp = np.asarray(pl.data_partition)
    ep = np.asarray(pl.embed_partition, dtype=np.int64)
    # (every id a sample reads: with multi-hot fields each bag id too, repeats weighing)
    counts = np.asarray(usage_counts(train_rows(ds), dp, parts, rows), dtype=np.int64)
    m_nominal = costmod.samples_per_part(n, parts)
    m_actual = np.bincount(dp.astype(np.int64), minlength=parts)
    remote_nom = np.zeros(parts)
    remote_act = np.zeros(parts)
    saved: dict[float, float] = dict.fromkeys(store_rates, 0.0)
    for w in range(parts):
        k = counts[:, w]
        mask = (ep != w) & (k > 0)
        remote_nom[w] = costmod.soft_count(k[mask], m_nominal, batch_size).sum()
        remote_act[w] = costmod.soft_count(k[mask], max(1, int(m_actual[w])), batch_size).sum()
        for rate in store_rates:
            mir = np.asarray(pl.mirror_rows(w, rate), dtype=np.int64)
            if mir.size:
                saved[rate] += float(costmod.soft_count(k[mir], m_nominal, batch_size).sum())
    total = float(remote_nom.sum())
    return {
        "batch_size": int(batch_size),
        "samples_per_part": int(m_nominal),
        "fetches_per_step": total,
        "fetches_per_step_actual_m": float(remote_act.sum()),
        "with_mirrors": {r: max(0.0, total - saved[r]) for r in store_rates},
    }


def plan_prediction(plan_path: Path | str) -> dict[str, Any]:
    """What the plan file itself reports: its batch size and fetches per step (no mirrors)."""
    meta = load_plan(Path(plan_path)).meta
    q = meta.get("quality", {})
    return {
        "plan_batch_size": int(meta.get("batch_size", q.get("batch_size", 0)) or 0),
        "plan_fetches_per_step": q.get("fetches_per_step"),
        "plan_seconds": (meta.get("timing") or {}).get("wall_s"),
    }
