"""The table of ``bench/gpu/epochs.sh``: per run, run-level and steady samples/s, each as a
ratio to the same batch's 1-GPU run, and what the epoch starts cost (a diagnosis: the run-level
time beyond the steady pace, per epoch start; it also holds the graphs' first captures).

    python bench/gpu/epochs_report.py RESULTS_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(d: dict, ref: dict | None) -> list[str]:
    speed, steady = d.get("speed") or 0.0, d.get("interval_speed") or 0.0
    cfg = d["config"]
    glob = cfg["batch_size"] * d.get("world_size", 1)
    samples = d["samples_seen"] - d.get("warmup_steps", 0) * glob
    extra = samples * (1 / speed - 1 / steady) if speed and steady else float("nan")
    starts = max(1, cfg["epochs"] - 1)
    r = (ref or {}).get("speed") or float("nan")
    rs = (ref or {}).get("interval_speed") or float("nan")
    scan = d.get("epoch_scan_ms_median")
    return [f"{speed / 1e6:.2f}M", f"{speed / r:.2f}", f"{steady / 1e6:.2f}M", f"{steady / rs:.2f}",
            f"{1e3 * extra / starts:.0f}", "" if scan is None else f"{scan:.1f}",
            f"{d.get('val_auc', float('nan')):.4f}"]  # fmt: skip


def main(folder: str) -> None:
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(folder).glob("w*_*.json"))}
    print(
        "| run | samples/s (run) | x 1 GPU | steady | x 1 GPU | ms per epoch start "
        "(beyond steady) | scan ms (median) | val AUC |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, d in runs.items():
        ref = runs.get("w1_" + name.rsplit("_", 1)[1])
        print(f"| {name} | " + " | ".join(row(d, ref)) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
