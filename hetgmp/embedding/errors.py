"""Errors of the embedding runtime (ValueError / RuntimeError subclasses for the CLI)."""

from __future__ import annotations

from hetgmp.comm.errors import CommError


class EmbeddingInputError(ValueError):
    """A batch of ids has the wrong dtype, shape, or ids outside ``[0, num_rows)``."""


class StalenessViolation(RuntimeError):
    """(Audit mode) a read used a mirror lagging its owner by more than the bound."""


__all__ = ["CommError", "EmbeddingInputError", "StalenessViolation"]
