"""An actor whose handlers call ``sys.exit``, for a process of its own (``actor_process``)."""

from __future__ import annotations

import sys
from typing import Any

import anyio
import anyio.lowlevel

from troupe.runtime import Actor, handles

__all__ = ["Quitter"]


class Quitter(Actor):
    """Exits its process from a handler: a synchronous one (run where the message was read)
    and an async one (run in the actor's task)."""

    @handles("exit_sync")
    def exit_sync(self, code: Any) -> None:
        sys.exit(code)

    @handles("exit_async")
    async def exit_async(self, code: Any) -> None:
        await anyio.lowlevel.checkpoint()
        sys.exit(code)
