"""Who may talk to a rank's RPC service: where it listens, and the ZeroMQ CURVE keys that keep
everyone but the job's own ranks out (:func:`negotiate`, at start-up, through the launch's
process group).

The rule (``auth``, ``--async-auth``):

* ``auto`` (the default): when every rank runs on one host the services listen on loopback
  (127.0.0.1), reachable from this host only, in the clear; across hosts they listen on the
  interface the host uses for outbound traffic and every connection is CURVE-authenticated
  and encrypted. A service that listens beyond loopback is never open.
* ``curve``: CURVE whatever the address (e.g. one host shared with users not to be trusted).
* ``insecure``: never CURVE, even across hosts: anyone who reaches the port can read rows and
  push gradients (for networks that are private already; documented as such).

Keys: every rank makes a key pair at start (``zmq.curve_keypair``) and the public keys go to
every rank through the process group's rendezvous (``all_gather_object``, over the launch's
own connections); secret keys never leave the process. A rank's service accepts a connection
only from a client whose public key is one of the job's (a ZAP handler: ``RpcService``), and
clients check the service's key, so a foreign client without a rank's secret key can neither
read nor push. If the installed libzmq lacks CURVE, a run that needs it stops with a message
saying so (``--async-auth insecure`` is the explicit way to run open).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket

from hetgmp.comm.collectives import all_gather_object
from hetgmp.comm.env import DistEnv
from hetgmp.comm.errors import LaunchError
from hetgmp.comm.rpc import wire

AUTH_CHOICES = ("auto", "curve", "insecure")
LOOPBACK = "127.0.0.1"


@dataclasses.dataclass(frozen=True)
class CurveKeys:
    """This rank's CURVE key pair (z85) and every rank's public key, in rank order."""

    public: bytes
    secret: bytes
    ranks: tuple[bytes, ...]


@dataclasses.dataclass(frozen=True)
class Security:
    """Where a rank's service listens and, if CURVE is on, its keys."""

    host: str
    keys: CurveKeys | None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def negotiate(env: DistEnv, host: str, auth: str) -> Security:
    """(Collective) the address this rank's service binds and its CURVE keys, by the rule of
    the module docstring. ``host``: ``auto`` or an address; ``auth``: one of
    :data:`AUTH_CHOICES`."""
    if auth not in AUTH_CHOICES:
        raise ValueError(f"async auth must be one of {AUTH_CHOICES}, got {auth!r}")
    zmq = wire.import_zmq()
    curve_ok = bool(zmq.has("curve"))
    public, secret = zmq.curve_keypair() if curve_ok else (b"", b"")
    seen = all_gather_object(env, (socket.gethostname(), public.decode()))
    one_host = len({h for h, _ in seen}) == 1
    if host == "auto":
        host = LOOPBACK if one_host else _outbound_address()
    elif not one_host and is_loopback(host):
        raise LaunchError(
            f"--async-host {host} is a loopback address but the ranks run on several hosts "
            f"({', '.join(sorted({h for h, _ in seen}))}): their services could not reach "
            "each other; use --async-host auto"
        )
    curve = auth == "curve" or (auth == "auto" and not is_loopback(host))
    if not curve:
        return Security(host, None)
    if not curve_ok:
        raise LaunchError(
            f"rank {env.rank}: the async services listen on {host}, beyond loopback, and need "
            "ZeroMQ's CURVE security, but the installed libzmq has no CURVE (zmq.has('curve') "
            "is False); install a pyzmq wheel (it bundles libzmq with CURVE), or pass "
            "--async-auth insecure to run the services open on a network you trust"
        )
    return Security(host, CurveKeys(public, secret, tuple(k.encode() for _, k in seen)))


def _outbound_address() -> str:
    """The address of the interface this host uses for outbound traffic."""
    from hetgmp.comm.launch import my_address

    return my_address()
