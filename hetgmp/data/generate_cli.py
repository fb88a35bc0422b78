"""Subcommands of this stage (placeholder until the stage lands)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # noqa: ARG001
    """Add this stage's subcommands to ``hetgmp``."""
