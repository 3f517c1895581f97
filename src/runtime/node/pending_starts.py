"""Starts a node was asked for and has not made yet, which a stop of their name cancels.

A ``stop_worker`` for a worker whose ``spawn_worker`` the node is still deciding on stops that
start: the node may wait before it starts a requested worker (the name held by another run's
replica, being stopped, or whose owner it asks the master about: up to 25 s), and a run that
ended meanwhile (finished, failed, Ctrl-C) sent its stop then. The stop found no worker of its
own (it stopped the other run's, or nothing), the start went on after the run had gone, and the
replica ran until the owner watch (``spawn_owners.py``) found its run gone, 20 s and more later.
Each request the node has not started yet is a :class:`PendingStart` until it does; a stop of its
name ends its waits at once and the request answers ``actor_stopped``, starting nothing. A
request it did start is a handle, which a stop stops as soon as its process exists
(``stop_asked``). A stop that names its sender's process (``owner_process``) cancels only the
requests of that process, or of none said (``stop_owners.py``); one by name alone, as older runs
send it, cancels every request of the name (a run asks again under another name). A stop that
cancelled a start answers ``true`` even with no worker to stop: the run's replica is stopped.
No node-wide memory of ended runs is needed: a run's stop follows its spawn on the same
connection, so it finds either the request pending or its worker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

__all__ = ["PendingStart"]

T = TypeVar("T")


class PendingStart:
    """A ``spawn_worker`` request the node has not started yet: ``stopped`` once a
    ``stop_worker`` of its name came meanwhile (its requester ended), and it starts nothing."""

    def __init__(self, name: str, owner: str | None, owner_process: str = "") -> None:
        self.name = name
        self.owner = owner
        self.owner_process = owner_process  # the requester's process ("": not said)
        self.stopped = anyio.Event()

    async def unless_stopped(self, waited: Callable[..., Awaitable[T]], *args: Any) -> T | None:
        """What ``waited(*args)`` returns; None as soon as the request is stopped (the wait is
        cancelled then), or was already."""
        result: list[T] = []
        if self.stopped.is_set():
            return None
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                result.append(await waited(*args))
                tg.cancel_scope.cancel()

            async def stop() -> None:
                await self.stopped.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(wait)
            tg.start_soon(stop)
        return result[0] if result else None
