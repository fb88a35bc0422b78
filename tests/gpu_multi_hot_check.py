"""One rank training a multi-hot data set on the fused pooling kernels, against the CPU run on
torch's pooling (issue 34).

    python tests/gpu_multi_hot_check.py DIR [--device cuda|cpu]

``--device cuda`` (``tests/test_train_multi_hot.py``'s GPU test; the bags compact and the whole
step one graph, ``hetgmp.train.multi_hot.ONE_RANK_COMPACT``, the tier's run against the variable
layout):
``hetgmp.train.multi_hot``'s ``GPU_ONE_RANK`` switched on, the GPU run (``--kernels triton``: the pooling and the row
kernels fused; CUDA graphs on, so the dense part replays as a graph while the whole step is
refused by name; fp32, ``--no-amp``, for a tight comparison) must end where the CPU run
(``--kernels torch``) ends: rows, optimizer state, dense layers and the validation loss to
tolerance (GPU atomics add in any order), for SGD and row-wise Adagrad rows, sum and mean
bags. ``--device cpu`` runs the same comparison on CPU with the kernels in Triton's
interpreter (``TRITON_INTERPRET=1`` in the environment; the tier-1 test's way). On CUDA the
host tier with bags too (``--rows-on host``, a 20 % cache, eager) against the GPU run. Prints
``MULTI HOT CHECK OK`` at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from hetgmp.comm.env import DistEnv
from hetgmp.config import validate
from hetgmp.data.format import open_dataset
from hetgmp.data.generate import generate_criteo_like
from hetgmp.train import multi_hot
from hetgmp.train.config import TrainConfig
from hetgmp.train.run import build_trainer, distributed_embedding
from hetgmp.train.runlog import RunLog


def make_data(root: Path, samples: int = 3000) -> Path:
    """A tiny generated set of ``samples``: the criteo-like single-hot fields plus two bags of
    mean length 6 (1 to 11 ids, repeated ids among them; the generator makes no empty bag:
    those are ``tests/test_pooling_kernels.py``'s)."""
    if not (root / "meta.json").exists():
        generate_criteo_like(root, num_samples=samples, scale=0.001, seed=2, multi_hot="2:6",
                             progress=False)  # fmt: skip
    return root


def run(root: Path, device: str, kernels: str, **kw: Any) -> dict[str, Any]:
    """Train ``root`` for two epochs on ``device`` with ``kernels``; rows sorted by id."""
    cfg = validate(TrainConfig(
        dataset=str(root), device=device, kernels=kernels, embed_dim=16,
        epochs=2, progress=False, log_every=100, warmup_steps=1, amp=False, seed=4,
        dense_optimizer="sgd", dense_lr=0.05, threads=1, **kw,
    ))  # fmt: skip
    tr = build_trainer(cfg, DistEnv(device=torch.device(device)), RunLog(active=False),
                       distributed_embedding)  # fmt: skip
    bags = tr.model.bags
    assert bags is not None and bags.backend == ("torch" if kernels == "torch" else "triton")
    res = tr.fit()
    sd = tr.model.embedding.state_dict()
    order = torch.argsort(sd["ids"])
    opt = sd["opt_state"]
    return {
        "weight": sd["weight"][order].cpu(),
        "opt": (opt[order] if opt.numel() else opt).cpu(),
        "dense": {k: v.detach().cpu() for k, v in tr.model.dense_state_dict().items()},
        "res": res,
    }


def compare(root: Path, device: str) -> None:
    multi_hot.GPU_ONE_RANK = True  # (what bench/gpu/switches.py sets for a benchmark)
    # (the interpreter runs a program per 64 output rows, each in milliseconds: there a few
    # steps of 32 samples (896 output rows, 14 programs a launch, ~190 bag entries a field:
    # repeated ids in every step), two epochs of 256 on a GPU)
    steps, batch = (0, 256) if device == "cuda" else (4, 32)
    for opt, pooling in (("adagrad", "sum,mean"), ("sgd", "mean,sum")):
        lr = 0.05 if opt == "adagrad" else 5.0
        kw = dict(optimizer=opt, pooling=pooling, lr=lr, iter=steps, batch_size=batch)
        want = run(root, "cpu", "torch", **kw)
        # (samples resident on the device, as a GPU run holds them: its id check meets the
        # bags' padding; interpreted on CPU too)
        got = run(root, device, "triton", data_on_device="on", **kw)
        torch.testing.assert_close(got["weight"], want["weight"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got["opt"], want["opt"], rtol=1e-4, atol=1e-6)
        for k in want["dense"]:
            torch.testing.assert_close(got["dense"][k], want["dense"][k], rtol=1e-3, atol=1e-5)
        a, b = got["res"], want["res"]
        assert abs(a["val_loss"] - b["val_loss"]) < 1e-4, (a["val_loss"], b["val_loss"])
        assert a["step"] == b["step"] == (steps or 22), (a["step"], b["step"])
        if device == "cuda":  # the whole step refused by name, the dense part replayed
            # (or, the bags compact on one rank, multi_hot.ONE_RANK_COMPACT, the whole step)
            want_graph = "whole step" if multi_hot.ONE_RANK_COMPACT else "multi-hot bags"
            assert want_graph in a["step_graph"], a["step_graph"]
            assert a["graph_replays"] > 5, a["graph_replays"]
        print(f"{opt} {pooling}: {device} triton == cpu torch ({a['step']} steps, "
              f"val_loss {a['val_loss']:.5f}; graph: {a['step_graph']})")  # fmt: skip
        # (rows in pinned host memory, a fifth of them cached on the GPU; against the
        # variable layout on the device, which the tier takes: multi_hot._fixed_on)
        if device == "cuda":
            ref = got if not multi_hot.ONE_RANK_COMPACT else variable_run(root, kw)
            tier_against(ref, run(root, device, "triton", rows_on="host", cache_budget=0.2,
                                  cuda_graphs=False, **kw))  # fmt: skip


def variable_run(root: Path, kw: dict[str, Any]) -> dict[str, Any]:
    """The device run with the bags in the variable layout (compact off for it)."""
    multi_hot.ONE_RANK_COMPACT = False
    try:
        return run(root, "cuda", "triton", **kw)
    finally:
        multi_hot.ONE_RANK_COMPACT = True


def tier_against(dev: dict[str, Any], tier: dict[str, Any]) -> None:
    """The host tier's run (``--rows-on host``, bags) equals the all-on-device one: rows,
    optimizer state, dense layers (its cache missed and wrote back)."""
    t = tier["res"]["host_tier"]
    assert t["misses"] > 0 and t["written_back"] > 0, t
    torch.testing.assert_close(tier["weight"], dev["weight"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tier["opt"], dev["opt"], rtol=1e-5, atol=1e-6)
    for k in dev["dense"]:
        torch.testing.assert_close(tier["dense"][k], dev["dense"][k], rtol=1e-4, atol=1e-6)
    print(f"host tier 20 % with bags == all on the device ({t['ahead']:.0f} batches ahead)")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path, help="where the tiny data set is (made if missing)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--samples", type=int, default=3000, help="samples of the set it makes")
    args = p.parse_args(argv)
    root = make_data(args.dir, args.samples)
    assert open_dataset(root).meta.multi_hot  # (the set has bags)
    compare(root, args.device)
    print("MULTI HOT CHECK OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
