"""Reads one step ahead (hetgmp.embedding.padded.ahead) in the captured multi-rank step, under
torchrun on 2 GPUs.

Run by ``tests/test_whole_step_multi.py`` (GPU) as ``python -m torch.distributed.run
--standalone --nproc_per_node 2 tests/gpu_read_ahead_check.py DIR``: the data set of
``gpu_whole_step_check.py``, row-wise Adagrad at bound 100, trained with the whole-step graph
that reads ahead and with the strict one. The graph that reads ahead must replay (its rows
primed during the previous step), every rank the same number of times, and train as well as
the strict order (validation loss within 0.01, rows close); rank 0 prints ``READ AHEAD CHECK
OK``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from hetgmp.comm.collectives import all_gather_object
from hetgmp.embedding.padded import ahead as read_ahead

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_whole_step_check import checked, run  # noqa: E402


def compare(env: Any, root: Path) -> None:
    """The step that reads ahead against the strict one (see the module docstring)."""
    kw = dict(optimizer="adagrad", bound=100, lr=0.05, val=True)
    read_ahead.ENABLED = True
    ahead = run(env, root, True, **kw)
    read_ahead.ENABLED = False
    strict = run(env, root, True, **kw)
    steps = all_gather_object(env, ahead["ahead_steps"])
    assert steps[0] == steps[1] and steps[0] > 10, steps
    la, ls = ahead["res"]["val_loss"], strict["res"]["val_loss"]
    assert abs(la - ls) < 0.01, (la, ls)
    torch.testing.assert_close(ahead["weight"], strict["weight"], rtol=0, atol=0.05)
    print(f"rank {env.rank}: {steps[0]} steps read ahead; val loss {la:.5f} vs strict {ls:.5f}")


if __name__ == "__main__":
    sys.exit(checked(compare, "READ AHEAD CHECK OK"))
