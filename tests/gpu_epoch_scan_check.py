"""The epoch-start scan's kernels on a CUDA GPU (:mod:`hetgmp.embedding.padded.epoch_scan`):
``python tests/gpu_epoch_scan_check.py [SAMPLES]``. At the card's scale (33.8M rows, 26 fields,
batch 8192, Zipf-like ids, 2 ranks' blocks) the kernels count exactly what the torch reference
(``torch.unique`` over the epoch's keys) counts, at bound 0 and 100, over two epochs; prints
both's time (a diagnosis: epoch 0 holds the first calls' compile, epoch 1 is warm) and
``EPOCH SCAN CHECK OK``."""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import torch

from hetgmp.embedding.padded import epoch_scan

ROWS, FIELDS, BATCH = 33_762_577, 26, 8192


def _timed(dev, fn, *args):  # type: ignore[no-untyped-def]
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    out = fn(*args)
    torch.cuda.synchronize(dev)
    return out, time.perf_counter() - t0


def main(samples: int) -> int:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    w = 2
    block = torch.randint(0, 3 * w, (ROWS,), generator=g, device=dev, dtype=torch.int32)
    store = SimpleNamespace(num_rows=ROWS, world=w, device=dev, block_of=block)
    u = torch.rand(samples, FIELDS, generator=g, device=dev)
    sparse = (u.pow(4) * ROWS).long().clamp_(max=ROWS - 1)  # (hot rows: a skewed draw)
    scan = epoch_scan.EpochScan(store)
    for bound in (0, 100):
        for epoch in range(2):
            pos = torch.randperm(samples, generator=g, device=dev)
            args = (bound, sparse, pos, BATCH)
            ref, t_ref = _timed(dev, epoch_scan.epoch_maxima_reference, store, *args)
            got, t_got = _timed(dev, scan.maxima, *args)
            assert torch.equal(ref, got), (bound, epoch, (ref != got).nonzero()[:5])
            print(f"bound {bound} epoch {epoch}: {ref.shape[0]} batches, reference "
                  f"{t_ref * 1e3:.1f} ms, kernels {t_got * 1e3:.1f} ms", flush=True)  # fmt: skip
    print("EPOCH SCAN CHECK OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000))
