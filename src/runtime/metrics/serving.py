"""Running a metrics endpoint for the life of a block, without importing prometheus-client
until one is configured (a node or master without ``metrics`` starts as lean as before)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import anyio

__all__ = ["Servable", "serving"]


class Servable(Protocol):
    """A server that serves until cancelled, and closes what it has not served yet."""

    async def serve(self) -> None: ...

    def close(self) -> None: ...


@asynccontextmanager
async def serving(server: Servable | None) -> AsyncIterator[None]:
    """Serve ``server`` (None: nothing) while the block runs; its socket is closed after,
    however the block ends."""
    if server is None:
        yield
        return
    failure: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            try:
                yield
            except BaseException as exc:  # raised below as it is, not wrapped in this group's
                failure = exc
            tg.cancel_scope.cancel()
    finally:
        server.close()
    if failure is not None:
        raise failure
