"""Which key pair a ``troupe run --cluster`` process uses, so that its master can reach it.

The run's runtime is a client of the master (leases, reports) and a server too: the master
calls the run's mailbox (``cancel_lease`` when a job is cancelled or a lease expires). Every
keyed member of a cluster connects to a server expecting the cluster's public key
(``security.auth.curve_client``), so a run whose mailbox served with an operator pair refused
its own master: every ``cancel_lease`` failed its handshake, and a ``ctl cancel`` reached the
run only when a renewal was refused, tens of seconds later.

So a run serves with the cluster pair where its keys directory holds it, as a node does. Where
it holds only an operator pair (an operator's machine, as README's "Security" distributes
keys), the master cannot reach the run; it still runs, and says so once at its start.

The master must reach the mailbox too: it listened on 127.0.0.1, so a master on another host
dialled its own loopback (``master_send_failed``), cluster pair or not. A run served with the
cluster pair listens where ``endpoint`` (``--endpoint``) says, else on the address of this host
that routes to the master (as the trainer ranks pick gloo's interface, ``actors/training/
ranks.py``), and registers that address. A run without the cluster pair keeps its mailbox on
loopback: served with another key (or none) off it, its nodes' pings would fail their
handshakes and have them stop the run's replicas, and a keyless mailbox on the LAN would take
orders from anyone.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from troupe.runtime.core.client import connect
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import ConfigError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.node.config import is_loopback
from troupe.runtime.node.reach import LOOPBACK_ANY_PORT, endpoint_host, is_wildcard, tcp_endpoint
from troupe.runtime.security.keys import CLUSTER
from troupe.runtime.security.process import KEYS_ENV, installed
from troupe.runtime.transports.endpoint_form import check_endpoint
from troupe.runtime.transports.route import source_address
from troupe.runtime.wire.codec import Codec

from .master_job import LEASE_S

__all__ = ["RunMailbox", "connect_run", "run_identity", "run_mailbox"]

log = get_logger(__name__)

# How often a run renews its leases (``source.MasterSource``): a third of their time.
_RENEW_EVERY_S = LEASE_S / 3


def run_identity(keys: str | os.PathLike[str] | None) -> tuple[str | None, str | None]:
    """The pair a run presents and serves with (None: the client's choice, ``load_keys``),
    and a line for people where the master will not be able to reach the run (else None).

    ``keys``: the run's ``--keys``; None: ``$TROUPE_KEYS``, as ``connect`` takes it."""
    if keys is None and installed() is None:
        keys = os.environ.get(KEYS_ENV) or None
    if keys is None:
        return None, None
    if (Path(keys) / f"{CLUSTER}.key_secret").is_file():
        return CLUSTER, None
    return None, (
        f"keys {keys} hold no cluster pair ({CLUSTER}.key_secret), so the master cannot reach "
        f"this run: a `ctl cancel` of its job stops it only at its next lease renewal (within "
        f"{_RENEW_EVERY_S:.0f} s); run it with the cluster's keys directory, as a node has, to "
        "have a cancel stop it at once"
    )


@dataclass(frozen=True)
class RunMailbox:
    """Where a cluster run's mailbox listens (``bind``), with which pair it serves
    (``identity``: ``run_identity``'s), and the line for people where the master cannot reach
    it (else None)."""

    bind: str
    identity: str | None
    warning: str | None


def run_mailbox(master: str, keys: str | os.PathLike[str] | None, endpoint: str | None = None) -> RunMailbox:
    """The mailbox of a run on the master at ``master`` (see the module docstring);
    ``endpoint``: the run's ``--endpoint``, None for the address that routes to the master.

    Raises:
        ConfigError: ``endpoint`` is no endpoint to bind, binds every interface (the master
            could not be told an address to call), or is off loopback without the cluster pair.
    """
    identity, warning = run_identity(keys)
    if endpoint is not None:
        try:
            check_endpoint(endpoint)
            loopback = is_loopback(endpoint)
        except ValueError as exc:
            raise ConfigError(f"--endpoint: {exc}") from None
        if is_wildcard(endpoint):
            raise ConfigError(
                f"--endpoint {endpoint}: a run's mailbox is registered with the master by its "
                "address; give this host's address the master reaches (tcp://HOST:PORT, PORT "
                "may be *)"
            )
        if not loopback and identity != CLUSTER:
            raise ConfigError(
                f"--endpoint {endpoint} is not on loopback and the run has no cluster pair "
                f"({CLUSTER}.key_secret) to serve it with; give the cluster's keys directory "
                "(--keys DIR, as a node has), or leave --endpoint out"
            )
        return RunMailbox(endpoint, identity, warning)
    route = _route_to(master)
    if route is None:  # the master is on this host: it reaches the run's loopback
        return RunMailbox(LOOPBACK_ANY_PORT, identity, warning)
    if identity != CLUSTER:
        if warning is None:
            warning = (
                f"this run has no CURVE keys, so its mailbox listens on loopback only and the "
                f"master at {master} (another host) cannot reach it: a `ctl cancel` of its job "
                f"stops it only at its next lease renewal (within {_RENEW_EVERY_S:.0f} s)"
            )
        return RunMailbox(LOOPBACK_ANY_PORT, identity, warning)
    return RunMailbox(tcp_endpoint(route, "*"), identity, warning)


def _route_to(master: str) -> str | None:
    """The address of this host that packets to the master at ``master`` leave from; None
    where the master is on this host (its address is one of this host's, or loopback) or
    where no route to it can be told (the connect then says why)."""
    host = endpoint_host(master)
    if host is None or is_loopback(master):
        return None
    local = source_address(host)
    if local is None or local in _addresses(host):
        return None
    return local


def _addresses(host: str) -> set[str]:
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except OSError:
        return set()


@asynccontextmanager
async def connect_run(
    master: str,
    keys: str | os.PathLike[str] | None,
    on_warning: Callable[[str], None] | None = None,
    codec: Codec | None = None,
    endpoint: str | None = None,
) -> AsyncIterator[Runtime]:
    """``connect`` to the master at ``master`` as ``run_mailbox`` says (``endpoint``: the run's
    ``--endpoint``), under ``codec``'s limits (``run_cluster.engine_codec``); tells
    ``on_warning`` its line, if any, before connecting.

    Raises:
        ConfigError: as ``run_mailbox``.
        Unreachable: the mailbox cannot be bound there.
    """
    mailbox = run_mailbox(master, keys, endpoint)
    if mailbox.warning is not None:
        log.warning("master_cannot_reach_run", master=master, detail=mailbox.warning)
        if on_warning is not None:
            on_warning(mailbox.warning)
    async with connect(master, keys=keys, identity=mailbox.identity, codec=codec, bind=mailbox.bind) as rt:
        yield rt
