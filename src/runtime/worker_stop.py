"""A spawned worker's stop, asked of its node and waited for only while that node may still answer.

A stop asked of a node that had died (killed, its host gone) while the master still listed it
waited out its whole deadline (``STOP_S``) in the background, and the run's exit waited with it.
It is given up at once, and said, once the master has the node as dead or stopped (where the run
keeps the master's list: ``left``, which says which), or once the node does not answer a ping
(``PROBE_S``), asked beside the stop and again every ``PROBE_S`` while the stop waits. A node
that answers pings is stopping the worker (its grace, then SIGKILL): it is waited for, up to
``STOP_S``. Given up, the stop is not withdrawn: a node that was only slow still stops the
worker; one that died took it with it.

Shared by the pipeline engine (a replica's stop) and the training driver (a rank's or encoder's
stop), as ``owned_controls.py`` is, whose stop it asks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

from troupe.runtime.errors import TroupeError
from troupe.runtime.owned_controls import OwnedControls
from troupe.runtime.placement import Host

if TYPE_CHECKING:
    from troupe.runtime.core.runtime import Runtime

__all__ = ["PROBE_S", "STOP_S", "node_silent", "stop_on_node"]

STOP_S = 30.0  # a node that answers: its worker's grace and kill, with room to spare
PROBE_S = 5.0  # a ping a node that lives answers, however busy its workers keep it


async def stop_on_node(
    controls: OwnedControls,
    name: str,
    host: Host,
    left: Callable[[Host], Awaitable[str]] | None = None,
    probe_s: float = PROBE_S,
) -> str | None:
    """Ask the node ``host`` to stop this run's worker ``name``.

    Args:
        controls: the run's controls (the stop names its process).
        name: the worker.
        host: its node.
        left: returns once the master no longer has ``host`` alive, how it has it (``dead``,
            ``stopped``; None: the run keeps no live list of the master's nodes; the ping alone
            decides).
        probe_s: the ping's deadline, and the pause between pings.

    Returns:
        None once the node answered; else why the stop was given up without its answer.

    Raises:
        TroupeError: the node answered with an error, or its answer did not come in ``STOP_S``.
    """
    given_up: list[str] = []
    failed: list[TroupeError] = []
    async with anyio.create_task_group() as tg:

        async def stop() -> None:
            try:
                await controls.ask(host.endpoint, "stop_worker", controls.named({"name": name}), STOP_S)
            except TroupeError as exc:
                failed.append(exc)
            tg.cancel_scope.cancel()

        async def declared_dead(left: Callable[[Host], Awaitable[str]]) -> None:
            how = await left(host)  # "stopped" where it said it stops (node_left): not dead
            given_up.append(f"the master has node {host.name} as {how}")
            tg.cancel_scope.cancel()

        async def probe() -> None:
            while True:
                why = await node_silent(controls.runtime, host, probe_s)
                if why is not None:
                    given_up.append(why)
                    tg.cancel_scope.cancel()
                    return
                await anyio.sleep(probe_s)

        tg.start_soon(stop)
        if left is not None:
            tg.start_soon(declared_dead, left)
        tg.start_soon(probe)
    if failed:
        raise failed[0]
    return given_up[0] if given_up else None


async def node_silent(runtime: Runtime, host: Host, probe_s: float = PROBE_S) -> str | None:
    """Why ``host``'s node is taken for gone (it does not answer a ping within ``probe_s``), or None."""
    try:
        await runtime.control(host.endpoint, "ping", None, timeout=probe_s)
    except TroupeError as exc:
        return f"node {host.name} does not answer a ping at {host.endpoint} ({type(exc).__name__})"
    return None
