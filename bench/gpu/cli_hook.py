"""The CLI's training run with a callback after every training step, and a report per rank: what
the step diagnoses (``host_profile.py``, ``barrier_waits.py``) share."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetgmp.train import trainer as trainer_module
from hetgmp.train.cli import main as cli_main


def run_with_step_hook(
    cli_args: list[str], after_step: Callable[[], None], report: Callable[[], str], out: str
) -> int:
    """``hetgmp train`` with ``cli_args``, ``after_step()`` after each training step; then
    ``report()`` written to ``out`` (``RANK``: the local rank) and printed by rank 0. Returns
    the CLI's exit code."""
    run = trainer_module.Trainer._run_step

    def stepped(self: Any, *a: Any, **kw: Any) -> Any:
        result = run(self, *a, **kw)
        after_step()
        return result

    trainer_module.Trainer._run_step = stepped  # type: ignore[method-assign]
    rc = cli_main(cli_args)
    rank = os.environ.get("LOCAL_RANK", "0")
    text = report()
    Path(out.replace("RANK", rank)).write_text(text + "\n")
    if rank == "0":
        print(text)
    return rc
