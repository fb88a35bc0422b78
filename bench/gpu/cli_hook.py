"""The CLI's training run with a callback after every training step, and a report per rank: what
the step diagnoses (``host_profile.py``, ``barrier_waits.py``, ``stream_ends.py``) share."""

from __future__ import annotations

import argparse
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


def reading_parser(doc: str) -> argparse.ArgumentParser:
    """The options of a diagnosis that reads the device every k-th step (``--out``,
    ``--skip``, ``--every``); its own may be added; the CLI's arguments follow ``--``."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", required=True, help="the report goes here (RANK: the local rank)")
    ap.add_argument("--skip", type=int, default=40, help="training steps before reading")
    ap.add_argument("--every", type=int, default=10, help="read every this many steps")
    return ap


def run_reading(
    args: argparse.Namespace, rest: list[str], read: Callable[[], None], report: Callable[[], str]
) -> int:
    """The CLI with ``rest`` (after ``--``), ``read()`` after every ``args.every``-th training
    step past ``args.skip`` on CUDA, then ``report()`` into ``args.out``."""
    import torch

    cli_args = rest[1:] if rest[:1] == ["--"] else rest
    seen = [0]

    def after_step() -> None:
        seen[0] += 1
        if seen[0] > args.skip and seen[0] % args.every == 0 and torch.cuda.is_available():
            read()

    return run_with_step_hook(cli_args, after_step, report, args.out)
