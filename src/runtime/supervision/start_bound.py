"""A bound on a worker's start: from its launch to its registration with the node.

The supervisor judges a worker by its beats, and a worker beats from a thread of its own as soon
as it runs: one whose imports, actor constructor or ``started()`` hook hang beats on, and it is
not busy with a message, so neither clock of :mod:`.liveness` ever fires. Such a worker stayed
"starting" for ever, in silence. The node therefore watches each start itself: it warns at a
third and at two thirds of ``[supervision] start_timeout_s`` (its kind's, where
``[supervision.kinds.<kind>]`` sets one), and at the bound kills the worker
as hung (reason ``start_timeout``), which then restarts under the node's restart policy, and is
``failed`` after ``max_restarts`` (a spawned replica is reported to whoever asked for it).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import anyio

from troupe.runtime.library_logging import get_logger
from troupe.runtime.node.worker_handles import HandleState, WorkerHandle

__all__ = ["START_TIMEOUT_REASON", "bound_start"]

log = get_logger(__name__)

START_TIMEOUT_REASON = "start_timeout"
_WARNINGS = 3  # warned at each third of the bound before the kill


def _still_starting(handle: WorkerHandle, incarnation: int) -> bool:
    return (
        handle.incarnation == incarnation
        and handle.state is HandleState.STARTING
        and handle.process is not None
        and handle.process.returncode is None
    )


async def bound_start(
    handle: WorkerHandle,
    bound_s: float,
    note_kill: Callable[[int | None, str], None],
    setting: str = "[supervision] start_timeout_s",
) -> None:
    """Watch the start of ``handle``'s current incarnation: warn while it lasts, and SIGKILL it
    at ``bound_s`` seconds after its launch; ``note_kill(pid, reason)`` is told first, so that
    its exit carries the reason. ``setting``: where the bound is set, named in the warnings as
    the one to raise. Returns as soon as it registers or exits."""
    incarnation, ended = handle.incarnation, anyio.Event()

    async def until(event: anyio.Event) -> None:
        await event.wait()
        ended.set()

    began = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(until, handle.ready_event)
        tg.start_soon(until, handle.exited_event)
        for step in range(1, _WARNINGS + 1):
            with anyio.move_on_after(max(0.0, began + bound_s * step / _WARNINGS - time.monotonic())):
                await ended.wait()
            if ended.is_set() or not _still_starting(handle, incarnation):
                break
            waited = round(time.monotonic() - began, 1)
            if step < _WARNINGS:
                log.warning(
                    "worker_start_slow",
                    worker=handle.spec.name,
                    worker_pid=handle.pid,
                    waited_s=waited,
                    killed_at_s=bound_s,
                    hint="still in its imports, an actor's constructor or its started() hook; "
                    f"it is killed as hung at {bound_s:g} s ({setting})",
                )
                continue
            note_kill(handle.pid, f"{START_TIMEOUT_REASON}: never finished starting within {bound_s:g}s")
            log.warning(
                "worker_start_timeout",
                worker=handle.spec.name,
                worker_pid=handle.pid,
                waited_s=waited,
                hint="its imports, an actor's constructor or its started() hook did not return; "
                f"killed as hung (raise {setting} if it needs longer)",
            )
            assert handle.process is not None
            try:
                handle.process.send_signal(signal.SIGKILL)
            except ProcessLookupError:  # it exited meanwhile: its exit says why
                pass
        tg.cancel_scope.cancel()
