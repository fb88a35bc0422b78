"""The plain-PyTorch contender's training machinery (``plain_ctr.py``): the splits resident on
the device, the table and head optimizers, the training step (eager or one CUDA graph), its
clock, and the evaluation on the test split."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from bench.gpu.plain_models import PlainCTR
from hetgmp.data.format import open_dataset
from hetgmp.metrics import log_loss, roc_auc

if TYPE_CHECKING:  # (plain_ctr imports this module: no import of it at run time)
    from bench.gpu.plain_ctr import Variant


@dataclasses.dataclass
class Split:
    """One split on the device: ids [N, F] int64, dense [N, D] float32 or None, labels [N, 1]."""

    ids: torch.Tensor
    dense: torch.Tensor | None
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def load_split(root: Path, split: str, device: torch.device) -> Split:
    """Copy a split of the dataset directory to ``device`` (int64 ids: what nn.Embedding wants)."""
    s = open_dataset(root).split(split)
    ids = torch.from_numpy(np.array(s.sparse)).to(device).long()
    dense = None if s.dense is None else torch.from_numpy(np.array(s.dense)).to(device)
    labels = torch.from_numpy(np.array(s.labels, dtype=np.float32)).to(device)
    return Split(ids, dense, labels.reshape(-1, 1))


def make_optimizers(
    model: PlainCTR, args: argparse.Namespace, v: Variant, device: torch.device, graph: bool
) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    """Sparse optimizer for the table, fused Adam (or SGD) for the dense head."""
    table, lr = [model.emb.weight], v.lr(args.lr)
    if v.opt == "sgd":  # foreach / fused kernels do not take sparse gradients
        sparse: torch.optim.Optimizer = torch.optim.SGD(table, lr=lr, foreach=False)
    elif v.opt == "adagrad":  # element-wise; the accumulator floor as hetgmp's --adagrad_init
        sparse = torch.optim.Adagrad(table, lr=lr, initial_accumulator_value=1e-7)
    else:
        sparse = torch.optim.SparseAdam(table, lr=lr)
    cuda = device.type == "cuda"
    dense_params = model.dense_parameters()
    if args.dense_opt == "adam":
        # capturable: Adam's step counter lives on the device, as CUDA-graph replay needs
        dense: torch.optim.Optimizer = torch.optim.Adam(
            dense_params, lr=args.dense_lr, fused=cuda, capturable=cuda and graph
        )
    else:
        dense = torch.optim.SGD(dense_params, lr=args.dense_lr, fused=cuda)
    return sparse, dense


class PlainTrainer:
    """The training step over device-resident data, eager or replayed from one CUDA graph."""

    def __init__(self, args: argparse.Namespace, v: Variant, train: Split, meta: Any,
                 device: torch.device) -> None:  # fmt: skip
        self.args, self.v, self.train, self.device = args, v, train, device
        torch.manual_seed(args.seed)
        # built on the device: a 33.8M x 128 table made and initialised on the CPU, then moved,
        # took ~45 s per variant on the H200 host (2026-11-24 run), 10x the timed steps
        with device:
            self.model = self.make_model(meta)
        # Adagrad / SparseAdam coalesce the sparse gradient: a host sync, not capturable
        self.use_graph = v.graph and device.type == "cuda" and v.opt == "sgd"
        self.sparse_opt, self.dense_opt = make_optimizers(
            self.model, args, v, device, self.use_graph
        )
        # the compiled head only trains; evaluation uses the eager one (last batch is ragged)
        self.head = torch.compile(self.model.head, dynamic=False) if v.compile else self.model.head
        b = args.batch
        self.nb = len(train) // b  # full batches only: fixed shapes for compile and graphs
        if self.nb < 1:
            raise ValueError(f"--batch {b}: the training split has only {len(train)} samples")
        g = torch.Generator(device=device).manual_seed(args.seed)
        perm = torch.randperm(len(train), generator=g, device=device)
        self.order = perm[: self.nb * b].view(self.nb, b)
        self.step_t = torch.zeros(1, dtype=torch.long, device=device)
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.graph_error = ""

    def make_model(self, meta: Any) -> PlainCTR:
        """The model for ``meta`` (under the device: built there); a subclass makes another
        (``plain_bags.py``: the multi-hot fields' ``nn.EmbeddingBag`` model)."""
        a = self.args
        return PlainCTR(
            a.model, num_rows=meta.num_embeddings, num_fields=meta.num_fields,
            num_dense=meta.num_dense, embed_dim=a.embed_dim, init_scale=a.init_scale,
        )  # fmt: skip

    def step(self) -> None:
        """One step, all on the device: batch by index, forward, backward, both optimizers."""
        rows = self.order.index_select(0, torch.remainder(self.step_t, self.nb)).view(-1)
        t = self.train
        ids = t.ids.index_select(0, rows)
        dense = None if t.dense is None else t.dense.index_select(0, rows)
        labels = t.labels.index_select(0, rows)
        # set_to_none: a sparse .grad would otherwise grow by concatenation every step
        self.sparse_opt.zero_grad(set_to_none=True)
        self.dense_opt.zero_grad(set_to_none=True)
        # autocast's weight cache must be off under graph capture (cached casts are not replayed)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.v.amp,
                            cache_enabled=not self.use_graph):  # fmt: skip
            logits = self.head(self.model.flat(ids, dense))
        loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
        loss.backward()
        self.sparse_opt.step()
        self.dense_opt.step()
        self.loss_sum += loss.detach()
        self.step_t += 1

    def _capture(self) -> None:
        """Record one step as a CUDA graph; on failure keep training eagerly (and say so)."""
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.step()
            self.graph = graph
        except Exception as err:  # noqa: BLE001 - any capture failure falls back to eager
            self.graph_error = f"{type(err).__name__}: {err}"[:300]
            print(f"[plain_ctr] CUDA graph capture failed, running eagerly: {self.graph_error}",
                  file=sys.stderr)  # fmt: skip
            torch.cuda.synchronize()

    def run(self, iters: int, warmup: int) -> dict[str, float]:
        """``iters`` steps in all; the first ``warmup`` (compile, capture) are not timed."""
        cuda = self.device.type == "cuda"
        t0 = time.perf_counter()
        stream = torch.cuda.Stream() if self.use_graph else None
        if stream is not None:  # warm-up on a side stream, as graph capture requires
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup):
                    self.step()
            torch.cuda.current_stream().wait_stream(stream)
            self._capture()
        else:
            for _ in range(warmup):
                self.step()
        if cuda:
            torch.cuda.synchronize()
        warm_s = time.perf_counter() - t0
        timed = iters - warmup
        clock = Clock(cuda)
        for _ in range(timed):
            if self.graph is not None:
                self.graph.replay()
            else:
                self.step()
        seconds = clock.stop()  # the loop's only host sync
        return {"warmup_s": warm_s, "timed_steps": timed, "timed_s": seconds,
                "train_loss": float(self.loss_sum) / max(1, iters)}  # fmt: skip


class Clock:
    """Elapsed seconds of a stretch of GPU work (CUDA events) or CPU work (perf_counter)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        if cuda:
            self.start, self.end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            self.start.record()
        self.t0 = time.perf_counter()

    def stop(self) -> float:
        if not self.cuda:
            return time.perf_counter() - self.t0
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1000.0


@torch.no_grad()
def evaluate(model: PlainCTR, test: Split, batch: int, amp: bool) -> dict[str, float]:
    """Exact AUC and log-loss over the whole test split (scores gathered, one copy to host)."""
    model.eval()
    probs = []
    for s in range(0, len(test), batch):
        dense = None if test.dense is None else test.dense[s : s + batch]
        with torch.autocast(test.ids.device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(test.ids[s : s + batch], dense)
        probs.append(torch.sigmoid(logits.float()))
    model.train()
    p = torch.cat(probs).cpu().numpy().ravel()
    y = test.labels.cpu().numpy().ravel()
    return {"val_auc": roc_auc(y, p), "val_loss": log_loss(y, p)}
