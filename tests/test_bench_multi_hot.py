"""Issue 34's one-GPU benchmark (bench/gpu/multi_hot_bag.py) in its CPU smoke mode: the data
set generated, hetgmp run through the module switch, the plain ``nn.EmbeddingBag`` contender
run, the markdown and JSON tables written; and the contender computes hetgmp's pooled input
(same rows in, same ``[B, (F + K) * D]`` out), so the comparison is of one model. No timings
are asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu.plain_bags import PlainBagCTR  # noqa: E402
from hetgmp.data.multi_hot_padded import PAD_ID  # noqa: E402
from hetgmp.models.pooling import BagLayout  # noqa: E402


def test_smoke_run_writes_both_contenders(tmp_path: Path) -> None:
    out = tmp_path / "res"
    cmd = [sys.executable, str(ROOT / "bench/gpu/multi_hot_bag.py"), "--smoke", "--out", str(out)]
    got = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    data = json.loads((out / "multi_hot_bag.json").read_text())
    assert data["smoke"] is True
    recs = data["records"]
    for batch in (256, 512):
        het = [r for r in recs if r["contender"] == "hetgmp" and r["batch"] == batch]
        plain = [r for r in recs if r["contender"] == "plain-embeddingbag" and r["batch"] == batch]
        assert len(het) == 1 and len(plain) == 1, recs
        assert het[0]["samples_per_s"] > 0 and plain[0]["samples_per_s"] > 0
        assert "GPU_ONE_RANK=1" in het[0]["command"] and "--pooling mean" in het[0]["command"]
        assert het[0]["ratio"] > 0 and 0.0 <= plain[0]["val_auc"] <= 1.0
        assert len(plain[0]["widths"]) == 2  # (the generator's two multi-hot fields)
    md = (out / "multi_hot_bag.md").read_text()
    assert "SMOKE" in md and md.count("\n| 256 |") == 1 and md.count("\n| 512 |") == 1
    assert (out / "data" / "meta.json").exists()  # (reused by a second run)


def test_plain_contender_pools_as_hetgmp() -> None:
    torch.manual_seed(0)
    rows, dim, widths = 30, 4, (3, 2)
    ids = torch.tensor([[1, 5, 5, 7, PAD_ID, 9], [2, PAD_ID, PAD_ID, PAD_ID, 9, 9],
                        [3, 0, 4, 6, PAD_ID, PAD_ID]])  # fmt: skip
    for pooling in (("sum", "mean"), ("mean", "sum")):
        m = PlainBagCTR("wdl", num_rows=rows, num_single=1, widths=widths, pooling=pooling,
                        num_dense=0, embed_dim=dim)  # fmt: skip
        plain_ids = torch.where(ids == PAD_ID, rows, ids)
        got = m.flat(plain_ids, None)
        table = torch.nn.Embedding.from_pretrained(m.emb.weight.detach()[:rows].clone())
        want = BagLayout(1, widths, pooling).lookup(table, ids).reshape(3, -1)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        assert float(m.emb.weight.detach()[rows].abs().sum()) == 0.0  # (the padding row)
