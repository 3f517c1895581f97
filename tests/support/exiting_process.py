"""An actor whose handlers call ``sys.exit`` or raise ``KeyboardInterrupt``, for a process of its
own (``actor_process``)."""

from __future__ import annotations

import sys
from typing import Any

import anyio
import anyio.lowlevel

from troupe.runtime import Actor, handles

__all__ = ["Quitter"]


class Quitter(Actor):
    """Exits its process from a handler: a synchronous one (run where the message was read),
    an async one (run in the actor's task), and one run on a thread (as a stage's plain
    ``process`` is)."""

    @handles("exit_sync")
    def exit_sync(self, code: Any) -> None:
        sys.exit(code)

    @handles("exit_async")
    async def exit_async(self, code: Any) -> None:
        await anyio.lowlevel.checkpoint()
        sys.exit(code)

    @handles("interrupt_sync")
    def interrupt_sync(self, _: Any) -> None:
        raise KeyboardInterrupt

    @handles("interrupt_async")
    async def interrupt_async(self, _: Any) -> None:
        await anyio.lowlevel.checkpoint()
        raise KeyboardInterrupt

    @handles("interrupt_in_thread")
    async def interrupt_in_thread(self, _: Any) -> None:
        await anyio.to_thread.run_sync(_interrupt)


def _interrupt() -> None:
    raise KeyboardInterrupt
