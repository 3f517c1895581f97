"""An actor whose handlers call ``sys.exit`` or raise ``KeyboardInterrupt`` (or a BaseException of
their own), and a stage whose ``process`` raises one, for a process of its own
(``actor_process``)."""

from __future__ import annotations

import sys
from typing import Any

import anyio
import anyio.lowlevel

from troupe.runtime import Actor, StageActor, handles

__all__ = ["OwnBase", "OwnBaseStage", "Quitter"]


class OwnBase(BaseException):
    """A BaseException of a user's own: not an Exception, so it ends the actor's process."""


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

    @handles("own_base_sync")
    def own_base_sync(self, _: Any) -> None:
        raise OwnBase("px base")

    @handles("own_base_async")
    async def own_base_async(self, _: Any) -> None:
        await anyio.lowlevel.checkpoint()
        raise OwnBase("px base")

    @handles("interrupt_in_thread")
    async def interrupt_in_thread(self, _: Any) -> None:
        await anyio.to_thread.run_sync(_interrupt)


def _interrupt() -> None:
    raise KeyboardInterrupt


class OwnBaseStage(StageActor):
    """A plain ``process`` that raises ``OwnBase``: run where the call was read (``process``), or
    on a worker thread (``process_direct`` holding outputs)."""

    def process(self, item: Any) -> Any:
        raise OwnBase("px base")
