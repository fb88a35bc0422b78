"""The memory plan printed before training (issue 32): a line per rank with its owned and
mirrored rows and their bytes (hetgmp.embedding.memory.table_bytes), data and free memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hetgmp.embedding.memory import table_bytes
from hetgmp.train.memory_plan import MIB, plan_lines

ROOT = Path(__file__).resolve().parent.parent


def test_two_ranks_print_their_rows(tiny_dataset, tmp_path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "hetgmp", "train", "--dataset", str(tiny_dataset.root), "--iter", "2",
        "--batch-size", "16", "--store-rate", "0.1", "--no-val", "--no-progress",
        "--threads", "1", "--embed-dim", "8",
    ]  # fmt: skip
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=55)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    at = lines.index("memory plan (per rank, before training)")
    rows = [lines[at + 2].split(), lines[at + 3].split()]
    assert [r[0] for r in rows] == ["0", "1"]
    num_rows = json.loads((tiny_dataset.root / "meta.json").read_text())["num_embeddings"]
    owned = [int(r[1].replace(",", "")) for r in rows]
    mirrored = [int(r[2].replace(",", "")) for r in rows]
    assert sum(owned) == num_rows  # every row has one owner
    assert all(m > 0 for m in mirrored)  # --store-rate 0.1 mirrors rows on each rank
    # the rows' bytes are the allocation check's estimate (Adagrad: one state value a row)
    want = table_bytes(num_rows, 8, owned[0] + mirrored[0], mirrored[0], 1, ranks=2) - (
        (owned[0] + mirrored[0]) * 4
    )
    assert rows[0][3] == f"{want / MIB:.1f}"
    assert rows[0][-1] == "cpu"


def test_plan_lines_align() -> None:
    r = {"owned": 10, "mirrored": 2, "rows_bytes": MIB, "state_bytes": 0, "data_bytes": MIB,
         "free": None, "device": "cpu"}  # fmt: skip
    lines = plan_lines([r, {**r, "owned": 1_000_000, "free": 5 * MIB}])
    assert len(lines[2]) == len(lines[3]) == len(lines[1]) - len("device") + len("cpu"), lines
    assert lines[2].split()[-2] == "?" and lines[3].split()[-2] == "5"
