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
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from troupe.runtime.core.client import connect
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.library_logging import get_logger
from troupe.runtime.security.keys import CLUSTER
from troupe.runtime.security.process import KEYS_ENV, installed
from troupe.runtime.wire.codec import Codec

from .master_job import LEASE_S

__all__ = ["connect_run", "run_identity"]

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


@asynccontextmanager
async def connect_run(
    master: str,
    keys: str | os.PathLike[str] | None,
    on_warning: Callable[[str], None] | None = None,
    codec: Codec | None = None,
) -> AsyncIterator[Runtime]:
    """``connect`` to the master at ``master`` with the pair ``run_identity`` picks, under
    ``codec``'s limits (``run_cluster.engine_codec``); tells ``on_warning`` its line, if any,
    before connecting."""
    identity, warning = run_identity(keys)
    if warning is not None:
        log.warning("master_cannot_reach_run", master=master, detail=warning)
        if on_warning is not None:
            on_warning(warning)
    async with connect(master, keys=keys, identity=identity, codec=codec) as rt:
        yield rt
