"""Resolving past an endpoint known dead.

A runtime remembers the endpoints whose connection ended (``Runtime._lost``: their process
died). The directory (a node, the master) learns of that death a little later: a node marks its
worker gone only once it has reaped the process (for a worker forked from the template, once the
template has), and a master from the node's next beat. Asked meanwhile, it still names the dead
process's endpoint; the ask sent there waited out its whole deadline in silence (nothing listens,
so no connection completes, and no second loss is seen), though the worker was back within a
fraction of a second. An answer that names a lost endpoint is therefore not believed: the
directory is asked again, briefly, until it names the restarted process or says the actor is not
running (``UnknownActor``, as for any actor between two incarnations).
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping

import anyio

from troupe.runtime.errors import AskTimeout, UnknownActor

from .directory import Directory
from .ref import ActorAddress

__all__ = ["STALE_ANSWER_WAIT_S", "resolve_live"]

# How long a lookup keeps asking while the directory still names a lost endpoint. A node
# reaps a killed worker within milliseconds, plus at most a second of its stderr; past this
# bound the answer may be right after all (a restarted process that bound the same port).
STALE_ANSWER_WAIT_S = 3.0
_FIRST_PAUSE_S = 0.02
_LONGEST_PAUSE_S = 0.25


async def resolve_live(
    directory: Directory,
    lost: MutableMapping[str, None],
    address: ActorAddress,
    within: float | None = None,
) -> tuple[ActorAddress, str]:
    """``directory.resolve(address)``, asked again while it names an endpoint in ``lost``.

    Args:
        directory: the runtime's directory (its cache is dropped for each stale answer).
        lost: the endpoints whose connection ended; one the directory still names after the
            bound is forgotten there, so that the next lookup believes it.
        address: what to resolve.
        within: the most seconds to keep asking (an ask's timeout); at most
            ``STALE_ANSWER_WAIT_S``.

    Raises:
        UnknownActor: the directory says so, or it still named the lost endpoint at the bound.
    """
    bound = STALE_ANSWER_WAIT_S if within is None else max(0.0, min(within, STALE_ANSWER_WAIT_S))
    give_up = time.monotonic() + bound
    answer_by = None if within is None else time.monotonic() + within
    pause = _FIRST_PAUSE_S
    while True:
        full, endpoint = await _asked(directory, address, answer_by, within)
        if endpoint not in lost or directory.lookup is None:  # a route only taught stays as taught
            return full, endpoint
        directory.forget(str(full))  # the cache holds the stale answer too
        left = give_up - time.monotonic()
        if left <= 0:
            lost.pop(endpoint, None)  # believed next time: it may be a new process on that port
            raise UnknownActor(
                f"{full}: the directory still names {endpoint} after {bound:g}s, though the "
                "connection there ended (its process died); not running again yet: try again"
            )
        await anyio.sleep(min(pause, left))
        pause = min(pause * 2, _LONGEST_PAUSE_S)


async def _asked(
    directory: Directory, address: ActorAddress, answer_by: float | None, within: float | None
) -> tuple[ActorAddress, str]:
    """``directory.resolve(address)``, by ``answer_by`` at the latest: an ask's lookup through
    a node that does not answer took the lookup's own 5 s, whatever the ask's timeout."""
    hit = directory.known(address)  # a cache hit waits on nothing: no deadline to set up
    if hit is not None or answer_by is None:
        return hit or await directory.resolve(address)
    with anyio.move_on_after(max(0.0, answer_by - time.monotonic())):
        return await directory.resolve(address)
    raise AskTimeout(
        f"{address}: no answer from the directory (its node) on where it runs within {within:g}s; "
        f"the node may be busy, hung or gone{directory.silence_hint}"
    )
