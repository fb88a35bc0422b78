"""The settings of ``--sync async`` (:class:`AsyncConfig`), apart from the engine so that the
training layer can build them without importing it."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class AsyncConfig:
    """Settings of ``--sync async``: ``max_lag`` steps a rank may run ahead of the slowest
    (-1: unbounded); each rank's service listens on ``host`` (``auto``: loopback when every
    rank runs on one host, else the interface for outbound traffic) at ``port_base + rank``
    (``port_base`` 0: a port the OS picks); ``auth``: who may connect
    (:mod:`hetgmp.comm.rpc.security`: ``auto``, ``curve``, ``insecure``); ``timeout_s``
    bounds every wait for a peer."""

    max_lag: int = 0
    host: str = "auto"
    port_base: int = 0
    timeout_s: float = 60.0
    auth: str = "auto"

    def __post_init__(self) -> None:
        if self.max_lag < -1:
            raise ValueError(f"max_lag must be >= 0, or -1 for unbounded; got {self.max_lag}")
        if not 0 <= self.port_base <= 65535:
            raise ValueError(f"async port base must be in [0, 65535], got {self.port_base}")
        if self.auth not in ("auto", "curve", "insecure"):
            raise ValueError(f"async auth must be auto, curve or insecure, got {self.auth!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"async timeout must be > 0, got {self.timeout_s}")
