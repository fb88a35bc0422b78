"""The ``env.closers`` entry that releases a padded transport's (or a graphed step's) CUDA
graphs before its process group goes (:func:`hetgmp.comm.launch.shutdown` runs the closers)."""

from __future__ import annotations

import weakref
from typing import Any

from hetgmp.comm.env import DistEnv


class GraphReleaser:
    """An ``env.closers`` entry: releases a padded transport's CUDA graphs (its
    ``release_graphs()``), if it still lives."""

    def __init__(self, owner: Any) -> None:
        self._owner = weakref.ref(owner)

    @classmethod
    def register(cls, env: DistEnv, owner: Any) -> None:
        """Add one for ``owner`` to ``env.closers``, dropping those of owners gone meanwhile
        (a bench builds many tables on one env)."""
        env.closers[:] = [c for c in env.closers if not isinstance(c, cls) or c.alive]
        env.closers.append(cls(owner))

    @property
    def alive(self) -> bool:
        return self._owner() is not None

    def __call__(self) -> None:
        owner = self._owner()
        if owner is not None:
            owner.release_graphs()
