"""Reaping what the node adopts: it is a child subreaper (for the workers its template forks),
so a process a worker started and left behind (a DataLoader worker, a shell a library ran) is
reparented to the node when that worker dies, and would stay a zombie once it exits.

The node's own children are waited for by whoever started them (asyncio, or a pidfd for the
forked workers), at once. A zombie child still there on two looks ``interval_s`` apart is
nobody's: it is reaped here, with ``WNOHANG`` and by its pid only, so that no one else's exit
status is ever taken.
"""

from __future__ import annotations

import contextlib
import os

import anyio
import psutil

from troupe.runtime.library_logging import get_logger

__all__ = ["reap_orphans", "unclaimed_zombies"]

log = get_logger(__name__)


def unclaimed_zombies() -> set[int]:
    """This process's children that are zombies now."""
    zombies = set()
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.status() == psutil.STATUS_ZOMBIE:
                zombies.add(child.pid)
    return zombies


async def reap_orphans(interval_s: float = 2.0) -> None:
    """Every ``interval_s``, reap the zombie children seen on the look before too (until cancelled)."""
    seen: set[int] = set()
    while True:
        await anyio.sleep(interval_s)
        zombies = unclaimed_zombies()
        for pid in zombies & seen:
            with contextlib.suppress(ChildProcessError):
                done, status = os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222  # never blocks
                if done:
                    log.info("orphan_reaped", orphan_pid=pid, returncode=os.waitstatus_to_exitcode(status))
        seen = zombies - seen
