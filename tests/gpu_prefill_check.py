"""The next batch's rows written in the exchange's tail (``hetgmp/embedding/padded/prefill.py``,
``PREFILL``) against the lookup at the step's start, under torchrun on 2 GPUs::

    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        tests/gpu_prefill_check.py DIR

Both train the same generated data set (tests/gpu_whole_step_check.py's) for 4 epochs (an
eager step that exchanges early at each epoch's start, between the replays) with whole-step
CUDA graphs, the next exchange right after backward and the fused segments over peer
payloads, at bound 0 and 100; the prefilled run's captured lookups must have taken the prefilled rows
(counted), then every rank compares its rows, optimizer state and dense layers (the same
bytes looked up: only the rows' GPU atomics differ in the last bits). Rank 0 prints
``PREFILL CHECK OK``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_whole_step_check import assert_same_state, checked, run  # noqa: E402


@contextlib.contextmanager
def prefilled_lookups() -> Iterator[list[int]]:
    """``PREFILL`` on, and ``[n]``: how many padded lookups took prefilled rows (captures and
    eager steps: a replay runs no host code); both undone after (tests/test_prefill.py too)."""
    from hetgmp.embedding import lookup
    from hetgmp.embedding.padded import prefill

    taken, forward = [0], lookup._PaddedLookup.forward

    def counted(ctx, anchor, stepper, values, batch, shape):  # type: ignore[no-untyped-def]
        taken[0] += batch.prefilled is not None
        return forward(ctx, anchor, stepper, values, batch, shape)

    lookup._PaddedLookup.forward = staticmethod(counted)  # type: ignore[method-assign]
    prefill.PREFILL = True
    try:
        yield taken
    finally:
        prefill.PREFILL = False
        lookup._PaddedLookup.forward = staticmethod(forward)  # type: ignore[method-assign]


def compare(env: Any, root: Path) -> None:
    for bound in (0, 100):
        # (4 epochs: eager early exchanges at each epoch's start between the replays)
        kw = dict(optimizer="adagrad", bound=bound, lr=0.05, epochs=4)
        base = run(env, root, True, **kw)
        with prefilled_lookups() as taken:
            filled = run(env, root, True, **kw)
        assert filled["replays"] > 10 and taken[0] > 0, (filled["replays"], taken)
        assert_same_state(filled, base)
        print(f"rank {env.rank} bound {bound}: prefilled == gathered ({taken[0]} lookups)",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(checked(compare, "PREFILL CHECK OK"))
