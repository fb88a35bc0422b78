"""Errors raised by the communication layer (all subclass RuntimeError so the CLI prints them)."""

from __future__ import annotations


class CommError(RuntimeError):
    """A collective failed: a peer rank died, raised, or did not answer within the timeout."""


class LaunchError(RuntimeError):
    """The process environment (mpirun / torchrun variables, devices, rendezvous) is unusable."""


class PeerFailedError(CommError):
    """Another rank reported a failure (e.g. bad input) during a collective step."""
