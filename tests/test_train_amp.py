"""``--amp`` (bf16 autocast for the dense part) through the training CLI on CPU."""

from __future__ import annotations

import json
import math
import re

import torch

from hetgmp.cli import main
from hetgmp.models.ctr import WDL


def test_amp_cli_run_finishes_with_finite_loss(tiny_dataset, tmp_path, capsys, monkeypatch) -> None:
    dtypes: list[torch.dtype] = []
    forward = WDL.forward

    def spy(self, sparse, dense=None):  # noqa: ANN001, ANN202
        out = forward(self, sparse, dense)
        if self.training:
            dtypes.append(out.dtype)
        return out

    monkeypatch.setattr(WDL, "forward", spy)
    log, out = tmp_path / "log.jsonl", tmp_path / "res.json"
    rc = main([
        "train", "--dataset", str(tiny_dataset.root), "--model", "wdl", "--amp",
        "--device", "cpu", "--iter", "3", "--batch-size", "64", "--embed-dim", "4",
        "--log-every", "1", "--threads", "1", "--no-progress", "--cache-dir", str(tmp_path),
        "--log-json", str(log), "--output", str(out),
    ])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0, text
    # The dense part really ran under bf16 autocast (the loss itself is taken in float32).
    assert dtypes and all(d == torch.bfloat16 for d in dtypes), dtypes
    losses = [float(v) for v in re.findall(r"^TRAIN \d+: loss (\S+)", text, re.M)]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses), text
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert recs[0]["kind"] == "config" and recs[0]["config"]["amp"] is True
    assert all(math.isfinite(r["loss"]) for r in recs if r["kind"] == "train")
    res = json.loads(out.read_text())
    assert res["step"] == 3 and math.isfinite(res["val_loss"]) and math.isfinite(res["val_auc"])
