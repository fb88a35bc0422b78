"""The asynchronous step engine (``--sync async``): each rank serves the rows it owns from a
ZeroMQ service thread, and ranks step at their own pace within ``--max-lag`` steps.

The public surface, for the training layer: :class:`AsyncStep` (the engine a
:class:`~hetgmp.embedding.DistributedEmbedding` exposes as ``async_engine``: the budget rule,
meetings, its RPC service for other layers' operations) and :class:`AsyncConfig` (the
settings); for the table, :class:`AsyncEngine` (the engine as a
:class:`~hetgmp.embedding.engine.StepEngine`). The rest is the engine's own:

* ``engine.py``: :class:`AsyncEngine`;
* ``step.py``: :class:`AsyncStep`, a step's phases and clocks;
* ``push.py`` / ``reads.py``: the push phase and the read phase of a step;
* ``service.py``: the row service (the operations on this rank's rows, the peers' clocks), on
  :mod:`hetgmp.comm.rpc`'s service; ``answer.py``: its arithmetic, scripted;
* ``lock.py``: the table lock the training thread and the service share;
* ``wire.py``: the row service's operations; ``config.py``: :class:`AsyncConfig`.
"""

from hetgmp.embedding.rowservice.config import AsyncConfig
from hetgmp.embedding.rowservice.engine import AsyncEngine
from hetgmp.embedding.rowservice.step import AsyncStep

__all__ = ["AsyncConfig", "AsyncEngine", "AsyncStep"]
