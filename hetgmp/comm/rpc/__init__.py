"""Point-to-point request/reply between ranks over ZeroMQ: each rank runs one service thread
(:class:`RpcService`) that answers the operations any layer registers on it, and reaches its
peers' services through :class:`Peers`. Messages are a JSON header and raw arrays (no pickle,
:mod:`.wire`); pyzmq is needed only here, and only under ``--sync async``.

Who uses it: the embedding's row service (:mod:`hetgmp.embedding.rowservice`), the dense
parameter server (:mod:`hetgmp.train.dense_server`) and work stealing
(:mod:`hetgmp.train.work_steal`), each registering its own operations."""

from hetgmp.comm.rpc.peers import Peers, Request, connect_peers
from hetgmp.comm.rpc.service import Handler, RpcService

__all__ = ["Handler", "Peers", "Request", "RpcService", "connect_peers"]
