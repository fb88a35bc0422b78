"""Process environment, process-group setup, collectives and the variable-size exchange."""

from hetgmp.comm.detect import LaunchInfo, detect_launch
from hetgmp.comm.env import DistEnv
from hetgmp.comm.errors import CommError, LaunchError, PeerFailedError
from hetgmp.comm.launch import init_distributed, shutdown

__all__ = [
    "CommError",
    "DistEnv",
    "LaunchError",
    "LaunchInfo",
    "PeerFailedError",
    "detect_launch",
    "init_distributed",
    "shutdown",
]
