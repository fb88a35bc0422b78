"""Where the dense part's time goes: hetgmp's WDL / DCN forward + backward + fused Adam on fixed
``[B, F, D]`` rows (no embedding table, no data), eager and as a CUDA graph, TF32 and bf16.

    python bench/gpu/dense_probe.py --batch 8192 65536 --out probe.txt

A diagnosis, not a figure that counts (the CLI's samples/s do). Variants of the WDL forward:

- ``repo``: :class:`hetgmp.models.WDL` as it is (:func:`hetgmp.models.layers.first_layer`:
  the wide logit fused into the first layer, no concatenation, aligned weight blocks);
- ``textbook``: ``wide(x) + deep_out(deep(x))`` on the concatenated input (HET-GMP's and plain
  PyTorch's way).

and of DCN: ``repo`` (the cross layers in torch, ``--kernels torch``) and ``fused`` (the cross
network on the Triton kernels of :mod:`hetgmp.models.cross`, what ``--kernels auto`` picks on
CUDA).

Prints ms per step of each and, for ``repo`` at each batch, the top kernels by GPU time.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

from hetgmp.models import build_model
from hetgmp.models.layers import flat_inputs

FIELDS, DENSE = 26, 13


class Rows(nn.Module):
    """The embedding's stand-in: the same ``[B, F, D]`` leaf every step (its gradient is
    taken, not accumulated, like the real table's)."""

    def __init__(self, rows: torch.Tensor) -> None:
        super().__init__()
        self.rows = rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.rows.grad = None
        return self.rows


def wdl_forward(model: nn.Module, variant: str, sparse: torch.Tensor, dense: torch.Tensor):
    """The WDL logits the way ``variant`` computes them (see the module docstring)."""
    if variant == "repo":
        return model(sparse, dense)
    x = flat_inputs(model.lookup(sparse), dense)
    return model.wide(x) + model.deep_out(model.deep(x))


def make_step(name: str, variant: str, batch: int, dim: int, amp: bool):
    dev = torch.device("cuda")
    rows = torch.randn(batch, FIELDS, dim, device=dev).mul_(0.01).requires_grad_()
    model = build_model(name, Rows(rows), num_fields=FIELDS, num_dense=DENSE, embed_dim=dim)
    model = model.to(dev)
    if variant == "fused":
        model.use_kernels("triton", dev)
    params = model.dense_parameters()
    opt = torch.optim.Adam(params, lr=1e-3, fused=True, capturable=True)
    sparse = torch.zeros(batch, FIELDS, dtype=torch.int64, device=dev)
    dense = torch.rand(batch, DENSE, device=dev)
    labels = (torch.rand(batch, 1, device=dev) < 0.3).float()

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp, cache_enabled=False):
            if name == "wdl":
                logits = wdl_forward(model, variant, sparse, dense)
            else:
                logits = model(sparse, dense)
        loss = F.binary_cross_entropy_with_logits(logits.float(), labels, reduction="sum")
        (loss / batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    return step


def time_it(step, graph: bool, iters: int = 20) -> float:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    run = step
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        run = g.replay
    run()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        run()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t) / iters


def kernel_table(step, rows: int = 18) -> str:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    return prof.key_averages().table(
        sort_by="self_device_time_total", row_limit=rows, max_name_column_width=90
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[8192, 65536])
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    lines = [f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, dim {args.dim}"]
    combos = [("wdl", "repo"), ("wdl", "textbook"), ("dcn", "repo"), ("dcn", "fused")]
    for b in args.batch:
        for name, variant in combos:
            for amp in (False, True):
                step = make_step(name, variant, b, args.dim, amp)
                eager, graph = time_it(step, False), time_it(step, True)
                lines.append(
                    f"batch {b} {name} {variant:9s} {'bf16' if amp else 'tf32'}: eager "
                    f"{eager:7.3f} ms, graph {graph:7.3f} ms, {b / graph / 1e3:6.2f} M samples/s"
                )
                print(lines[-1], flush=True)
                del step
                torch.cuda.empty_cache()
        for amp in (False, True):
            lines += [f"\nkernels: batch {b} wdl repo {'bf16' if amp else 'tf32'}"]
            lines.append(kernel_table(make_step("wdl", "repo", b, args.dim, amp)))
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-4:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
