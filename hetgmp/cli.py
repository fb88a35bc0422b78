"""``hetgmp <subcommand>``: one console entry point for every stage.

Each stage's module registers its own subcommands (``register(subparsers)``) and handles them
through ``args.func(args)``, so this file stays a list of stages.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

# Modules that contribute subcommands, in the order they appear in --help.
COMMAND_MODULES = (
    "hetgmp.data.generate_cli",  # generate, dataset
    "hetgmp.data.preprocess_cli",  # preprocess
    "hetgmp.partition.cli",  # partition
    "hetgmp.train.cli",  # train
    "hetgmp.experiments.cli",  # experiment
    "hetgmp.serve.cli",  # export, predict
)
# Subcommands whose module alone is loaded when they are run. No command module imports torch
# at the top (its handlers do), so --help, which loads all, starts in a fraction of a second
# (tests/test_cli_help.py).
LIGHT_COMMANDS = {"preprocess": "hetgmp.data.preprocess_cli"}


def build_parser(modules: Sequence[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    from hetgmp.config_file import ConfigFileParser

    # (its class is every subcommand's too, so ``--config FILE`` works where a command adds it)
    parser = ConfigFileParser(
        prog="hetgmp",
        description="Train CTR models with partitioned, mirrored, bounded-staleness embeddings.",
    )
    from hetgmp import __version__

    parser.add_argument("--version", action="version", version=f"hetgmp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    light = LIGHT_COMMANDS.get(argv[0]) if argv else None
    parser = build_parser((light,) if light else COMMAND_MODULES)
    args = parser.parse_args(argv)
    from hetgmp.signals import Terminated, terminate_as_interrupt

    try:
        with terminate_as_interrupt():  # SIGTERM unwinds like Ctrl-C: temp files get removed
            rc = args.func(args)
    except Terminated:
        print("terminated (SIGTERM)", file=sys.stderr)
        return 128 + 15
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (``hetgmp partition stats --json | head``): not an error of
        # ours; stdout is pointed at devnull so the interpreter's final flush stays quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        # Our error types subclass ValueError/RuntimeError and carry user-facing messages.
        if getattr(args, "debug", False):
            raise
        from hetgmp.comm.failure import reports_error

        if reports_error(err):  # (under mpirun: the first rank to fail, not every rank)
            print(f"hetgmp {args.command}: error: {err}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
