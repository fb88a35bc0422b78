"""Serving: export a checkpoint (``hetgmp export``), load it, score (``hetgmp predict``).

::

    import hetgmp.serve
    scorer = hetgmp.serve.load("model/", device="cuda")
    probs = scorer.score(ids, dense)

The artifact format is in docs/serving.md. This package's ``__init__`` imports no torch (the
command line's ``--help`` loads it); :func:`load`, :class:`Scorer` and :class:`CompileError` (the
fast path could not be built) are imported on first use.
"""

from __future__ import annotations

from typing import Any

from hetgmp.serve.artifact import ARTIFACT_FORMAT, ARTIFACT_VERSION, ArtifactError

__all__ = ["ARTIFACT_FORMAT", "ARTIFACT_VERSION", "ArtifactError", "CompileError", "Scorer", "load"]


def __getattr__(name: str) -> Any:
    if name in ("load", "Scorer"):
        from hetgmp.serve import scorer

        return getattr(scorer, name)
    if name == "CompileError":
        from hetgmp.serve.compiled import CompileError

        return CompileError
    raise AttributeError(f"module 'hetgmp.serve' has no attribute {name!r}")
