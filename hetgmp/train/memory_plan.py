"""The memory plan printed before training (issue 32): per rank, the rows it owns and mirrors,
the bytes of its rows, their optimizer state and its training data, against the device's free
memory, as TorchRec's planner prints its sharding plan.

The table's bytes come from :func:`hetgmp.embedding.memory.table_bytes`, the same estimate that
refuses a table too large for its device (``check_fits``, before anything is allocated); this
module only reports, one line per rank, from rank 0. With rows in host memory (``--rows-on
host``, :mod:`hetgmp.embedding.tiered`) the rows and state columns are the device cache's (its
slot map with the rows), and a line per rank says the cache's share and the host's bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hetgmp.comm.collectives import all_gather_object
from hetgmp.comm.env import DistEnv
from hetgmp.embedding import DistributedEmbedding
from hetgmp.embedding.memory import table_bytes

MIB = 1 << 20


def free_bytes(device: torch.device) -> int | None:
    """Free memory of ``device``: CUDA's, or on CPU the host's available memory (Linux)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rank_memory(
    emb: Any, samples: int, sample_bytes: int, device: torch.device, batch_ids: int = 0
) -> dict[str, Any]:
    """This rank's line of the plan (rows, bytes) for a :class:`DistributedEmbedding`; a
    device-decided host tier first reserves its miss entries for ``batch_ids`` (the run's
    largest batch's table ids), so that the plan counts them."""
    own, mir, state = 0, 0, 0
    rows_b = 0
    if isinstance(emb, DistributedEmbedding):
        own, mir, state = emb.n_own, emb.n_mir, emb.opt.state_width
        total = table_bytes(emb.num_rows, emb.dim, own + mir, mir, state, ranks=emb.env.world_size)
        state_b = (own + mir) * 4 * state
        rows_b = total - state_b
    else:
        total, state_b = 0, 0
    out = {
        "owned": own, "mirrored": mir, "rows_bytes": rows_b, "state_bytes": state_b,
        "data_bytes": samples * sample_bytes, "free": free_bytes(device), "device": str(device),
    }  # fmt: skip
    tier = getattr(emb, "tier", None)
    if tier is not None:  # (the device holds the cache; host memory the rows)
        reserve = getattr(tier, "reserve", None)
        if reserve is not None and batch_ids:
            reserve(batch_ids)
        mem = tier.memory()
        out["state_bytes"] = tier.cache_state.nbytes
        out["rows_bytes"] = mem["device"] - out["state_bytes"]
        out["tier"] = {"cache_rows": tier.budget, "rows": tier.num_rows, **mem}
    return out


def plan_lines(ranks: list[dict[str, Any]]) -> list[str]:
    """The plan as aligned lines: a header and one line per rank."""
    head = f"{'rank':>4} {'owned':>10} {'mirrored':>9} {'rows MiB':>9} {'state MiB':>9} "
    head += f"{'data MiB':>9} {'total MiB':>9} {'free MiB':>9}  device"
    lines = ["memory plan (per rank, before training)", "  " + head]
    for i, r in enumerate(ranks):
        total = r["rows_bytes"] + r["state_bytes"] + r["data_bytes"]
        free = "?" if r["free"] is None else f"{r['free'] / MIB:.0f}"
        lines.append(
            f"  {i:>4} {r['owned']:>10,} {r['mirrored']:>9,} {r['rows_bytes'] / MIB:>9.1f} "
            f"{r['state_bytes'] / MIB:>9.1f} {r['data_bytes'] / MIB:>9.1f} {total / MIB:>9.1f} "
            f"{free:>9}  {r['device']}"
        )
    for i, r in enumerate(ranks):
        t = r.get("tier")
        if t is not None:
            what = "rows, state, slot map"
            if t.get("entries"):  # (the device-decided tier: each batch's misses on the device)
                what = f"rows, {t['entries']:,} miss entries, state, slot maps"
            lines.append(
                f"  rank {i} host tier: device cache {t['cache_rows']:,} of {t['rows']:,} rows "
                f"({100 * t['cache_rows'] / t['rows']:.1f} %), {t['device'] / MIB:.1f} MiB on "
                f"{r['device']} ({what}); host memory {t['host'] / MIB:.1f} MiB "
                "(every row and its state)"
            )
    return lines


def memory_plan(
    env: DistEnv, emb: Any, split: Any, indices: np.ndarray, batch: int = 0
) -> list[str]:
    """The plan's lines (collective: every rank calls; rank 0 prints them); ``batch``: the
    run's largest batch in samples (training or evaluation)."""
    row = split.sparse.itemsize * split.sparse.shape[1] + split.labels.itemsize
    if split.dense is not None:
        row += split.dense.itemsize * split.dense.shape[1]
    ids = batch * int(split.sparse.shape[1])  # (the table's ids per batch, at most)
    mine = rank_memory(emb, int(len(indices)), int(row), env.device, ids)
    return plan_lines(all_gather_object(env, mine))
